"""`[providers.<name>]`: where a run's sandboxes come from, one table per environment backend.

A runtime names a provider (`[runtime.options] provider = "local"`); the table says which backend it is
(`type`) and how to use it. Blaxel and Daytona read credentials from the environment (or `.env`), never
from the config, so a config can be shared.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from loops_nb.config.sections import Section, WorkdirPath


class LocalProviderConfig(Section):
    type: Literal["local"] = "local"
    """`local`: each trial runs in a bubblewrap sandbox on this machine; no Docker, no image builds."""

    scratch_dir: WorkdirPath | None = None
    """Where sandbox directories are made (default: the system temp directory). Each trial gets its
    own directory backing the sandbox's writable paths; it is removed when the trial ends."""

    network: Literal["none", "host"] = "none"
    """`none`: no sandbox gets network, whatever the task says; verifiers get uv, uvx and pytest from the
    Python environment running loops_nb instead of downloading them. `host` (opt-in, for a machine with a
    network): sandboxes share the host's network, except tasks with `network_mode = "no-network"`."""

    hidden_paths: list[str] = Field(default_factory=list)
    """Host paths the sandbox must not see (each is covered by an empty directory), e.g. `/home`.
    Everything else on the host is visible read-only."""

    ignore_dockerfile: bool = False
    """A task whose `environment/Dockerfile` has RUN steps, or that names a `docker_image`, is refused
    (the local sandbox builds no images). `true` runs it anyway on the host's tools; use it only when
    the host already has what the Dockerfile installs."""

    keep_sandboxes: bool = False
    """Keep each trial's sandbox directory after the trial, for debugging. They stay live in the resource
    journal, and `loops cleanup` removes them."""


class DockerProviderConfig(Section):
    type: Literal["docker"] = "docker"
    """`docker`: Harbor's own Docker environment on the local daemon (builds each task's Dockerfile).
    Its containers are Harbor's, not in the resource journal: after a crash, check `docker ps`."""

    force_build: bool = False
    """Rebuild each task's image even when Docker has it cached."""


class BlaxelProviderConfig(Section):
    type: Literal["blaxel"] = "blaxel"
    """`blaxel`: Blaxel sandboxes (extra `harbor-blaxel`; credentials `BL_API_KEY` and `BL_WORKSPACE`,
    or a `bl login`)."""

    region: str | None = None
    """Blaxel region (default: `BL_REGION`, else Blaxel's default)."""

    ttl: str | None = None
    """Longest life of a sandbox, e.g. `6h` (Harbor's default: 24h). A backstop if cleanup never runs."""


class DaytonaProviderConfig(Section):
    type: Literal["daytona"] = "daytona"
    """`daytona`: Daytona sandboxes (extra `harbor-daytona`; credentials `DAYTONA_API_KEY`, or
    `DAYTONA_JWT_TOKEN` with `DAYTONA_ORGANIZATION_ID`; the region is `DAYTONA_TARGET`)."""

    auto_stop_interval_mins: int | None = Field(None, ge=0)
    """Stop an idle sandbox after this many minutes (a backstop if cleanup never runs)."""

    ttl_minutes: int | None = Field(None, ge=1)
    """Daytona's time-to-live for a sandbox, in minutes (Harbor keeps a sandbox alive while its trial
    uses it): a backstop that deletes what a crashed run left if `loops cleanup` never runs."""


ProviderConfig = Annotated[
    LocalProviderConfig | DockerProviderConfig | BlaxelProviderConfig | DaytonaProviderConfig,
    Field(discriminator="type"),
]
