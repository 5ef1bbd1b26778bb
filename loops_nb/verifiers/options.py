"""`VerifiersOptions`: the `[runtime.options]` of the verifiers runtime, one field a setting.

[runtime]
factory = "loops_nb.verifiers:create_runtime"

[runtime.options]
env_id = "reverse-text"                     # the environment's id, as `vf.load_environment` takes it
packages = ["reverse-text"]                 # what provides it, installed beside verifiers
env_args = { num_tasks = 64 }     # the taskset's config fields (`--env.taskset.*` in verifiers)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from loops_nb.errors import ConfigError

DEFAULT_VERIFIERS = "verifiers==0.4.0"
"""The verifiers the kit builds its environment with (and the tested one)."""

TESTED_VERSIONS = ("0.4.",)
"""Version prefixes of verifiers the kit is tested with; `loops check` refuses others."""


class VerifiersOptions(BaseModel):
    """`[runtime.options]` of `loops_nb.verifiers:create_runtime`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    env_id: str = Field(min_length=1)
    """The verifiers environment to train on: its id as `verifiers.load_environment` takes it
    (`reverse-text`, `primeintellect/reverse-text`, or the module name of a local environment)."""

    env_args: dict[str, JsonValue] = Field(default_factory=dict)
    """The taskset's config fields (verifiers 0.4 `--env.taskset.*`); a key the taskset lacks is refused."""

    harness: dict[str, JsonValue] | None = None
    """The harness the episode's agent runs in (`{ id = "null" }`: the plain chat loop). Empty: the
    environment's own harness, else the plain chat loop."""

    packages: list[str] = Field(default_factory=list)
    """What provides the environment, installed beside verifiers in its own uv environment: pip
    requirements (`reverse-text`, `vf-math==0.1.2`) or local directories (relative to the config). Empty:
    the environment must come with verifiers itself (or with `python`'s environment)."""

    verifiers: str = DEFAULT_VERIFIERS
    """The verifiers requirement the environment is built with; versions outside 0.4.x are refused by
    `loops check` (untested)."""

    python: str | None = None
    """An interpreter that already has verifiers and the environment installed: used as it is, nothing is
    built. Empty: the kit builds (once, then reuses) a uv environment for `verifiers` + `packages`."""

    cache_dir: str | None = None
    """Where built environments are kept, one directory per set of requirements (relative to the config). Empty:
    `$LOOPS_NB_VERIFIERS_CACHE`, else `~/.cache/loops_nb/verifiers`."""

    split: Literal["train", "eval"] = "train"
    """Passed to the taskset as its `split` field, where it has one; verifiers 0.4 tasksets have no split of
    their own, so a taskset without that field gives the same tasks for both."""

    limit: int | None = Field(None, ge=1)
    """At most this many tasks (the first ones of the split). Empty: all of them."""

    episodes: Literal["per_attempt", "shared"] = "per_attempt"
    """`per_attempt`: each attempt's episode in a verifiers process of its own, which holds only that
    attempt's lease key (and imports verifiers and loads the environment anew). `shared`: one verifiers
    process runs every episode (loaded once, much cheaper an attempt), but it holds every running attempt's
    key, so an environment's code could sample as another attempt: for environments you trust."""

    episode_timeout_seconds: float = Field(600.0, gt=0)
    """How long one attempt's episode may run (its model calls, tools and rubric); past it the episode is
    killed and the attempt discarded as `timeout`."""

    load_timeout_seconds: float = Field(600.0, gt=0)
    """How long loading the environment and listing its tasks may take (datasets download then)."""

    build_timeout_seconds: float = Field(1800.0, gt=0)
    """How long building the environment's uv environment may take."""

    sampling: dict[str, JsonValue] = Field(default_factory=dict)
    """Sampling arguments the episode's model calls send (`max_tokens`, `temperature`). Empty: the run's
    `[sampling]` applies to every call, as for any agent."""

    model: str = "policy"
    """The model name the episode's calls send; the gateway serves the run's policy whatever it is."""

    offline: bool = False
    """Load and run the environment with `HF_HUB_OFFLINE=1` and `HF_DATASETS_OFFLINE=1`: its datasets must
    already be in the Hugging Face cache, and one that must download refuses in `loops check`."""

    pass_env: list[str] = Field(default_factory=list)
    """Variables the verifiers process inherits besides PATH, HOME, the locale and the Hugging Face cache
    settings (an environment's judge key, say). The run's own credentials cannot be named."""

    driver: str | None = None
    """The episode driver script the verifiers interpreter runs. Empty: the kit's own
    (`loops_nb/verifiers/episode_driver.py`). For tests and development."""

    @classmethod
    def parse(cls, options: dict[str, Any]) -> VerifiersOptions:
        try:
            parsed = cls.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"runtime.options (verifiers): {problems}") from None
        from loops_nb.model_access.agent_env import refused_agent_env_name

        for name in parsed.pass_env:
            why = refused_agent_env_name(name)
            if why is not None:
                raise ConfigError(f"runtime.options.pass_env: {why}")
        return parsed
