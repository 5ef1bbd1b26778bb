"""Provider adapters: what each `[providers.<name>]` backend needs, how Harbor reaches it, and how a
journalled sandbox of it is released after a crash.

An adapter never needs the process that created a resource: `release` works from the journal line
alone, so `loops cleanup` can run in a fresh process after a `kill -9`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from loops_nb.errors import ConfigError
from loops_nb.providers.bubblewrap import bwrap_path, remove_tree
from loops_nb.providers.provider_config import (
    BlaxelProviderConfig,
    DaytonaProviderConfig,
    DockerProviderConfig,
    LocalProviderConfig,
    ProviderConfig,
)
from loops_nb.providers.sandbox_session import SandboxUnavailable
from loops_nb.resources import ResourceEntry

if TYPE_CHECKING:
    from harbor.models.trial.config import EnvironmentConfig

SANDBOX_DIR_NAME = "loops_nb_sandboxes"


class ProviderAdapter:
    """One `[providers.<name>]` table's backend. A subclass names its `type`, its config model, the Python
    modules it needs (and the extra that installs them) and, for a journalled sandbox, its Harbor class."""

    type: ClassVar[str]
    config_model: ClassVar[Callable[[], ProviderConfig]]
    modules: ClassVar[tuple[str, ...]] = ("harbor",)
    extra: ClassVar[str] = "harbor"
    environment_class: ClassVar[str] = ""
    """`module:Class` of the journalled Harbor environment, which gets the config's fields as kwargs."""

    def __init__(self, name: str, config: ProviderConfig) -> None:
        self.name, self.config = name, config

    def problems(self) -> list[str]:
        """What stops this provider from working here (missing extra, credentials, tools); [] if none."""
        for module in self.modules:
            if importlib.util.find_spec(module) is None:
                return [
                    f"providers.{self.name}: the {self.extra} extra is not installed: `uv sync --extra {self.extra}`"
                ]
        return [f"providers.{self.name}: {problem}" for problem in self.backend_problems()]

    def backend_problems(self) -> list[str]:
        """What the backend itself lacks here (tools, credentials), once its modules are installed."""
        return []

    def harbor_environment(self, journal: Path) -> EnvironmentConfig:
        """Harbor's `EnvironmentConfig` for a trial whose sandboxes go in `journal`."""
        from harbor.models.trial.config import EnvironmentConfig

        options = self.config.model_dump(mode="json", exclude={"type"}, exclude_none=True)
        return EnvironmentConfig(
            import_path=self.environment_class, kwargs={"loops_journal": str(journal), **options}
        )

    async def release(self, entry: ResourceEntry) -> str:
        """Release a journalled resource; returns what was done, for the cleanup report."""
        raise NotImplementedError


def _not_found(exc: Exception) -> bool:
    return "not found" in str(exc).lower() or "404" in str(exc)


class LocalProvider(ProviderAdapter):
    type = "local"
    config_model = LocalProviderConfig
    environment_class = "loops_nb.providers.local:LocalSandboxEnvironment"
    config: LocalProviderConfig

    def backend_problems(self) -> list[str]:
        try:
            bwrap = bwrap_path()
        except SandboxUnavailable as exc:
            return [str(exc)]
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            return [
                f"bubblewrap cannot create a sandbox here ({probe.stderr.strip()[:200]}); it needs "
                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root"
            ]
        return []

    def harbor_environment(self, journal: Path) -> EnvironmentConfig:
        config = super().harbor_environment(journal)
        base = self.config.scratch_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        config.kwargs["scratch_dir"] = str(Path(base).resolve())
        return config

    async def release(self, entry: ResourceEntry) -> str:
        path = Path(entry.provider_id or entry.detail.get("path") or "")
        # Only ever delete what the local sandbox made: a directory under a loops_nb_sandboxes folder.
        if path.parent.name != SANDBOX_DIR_NAME:
            return f"skipped: {path} is not a local sandbox directory"
        if not path.exists():
            return f"already gone: {path}"
        if not await asyncio.to_thread(remove_tree, path):
            # Raising keeps the entry live, so the next cleanup tries again instead of forgetting it.
            raise OSError(f"could not remove {path}")
        return f"removed {path}"


class DockerProvider(ProviderAdapter):
    type = "docker"
    config_model = DockerProviderConfig
    config: DockerProviderConfig

    def backend_problems(self) -> list[str]:
        if shutil.which("docker") is None:
            return [
                "the docker CLI is not on PATH; install Docker, or use the local provider (bubblewrap) or "
                "blaxel/daytona"
            ]
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
        if info.returncode != 0:
            return ["the Docker daemon is not reachable (`docker info` failed)"]
        return []

    def harbor_environment(self, journal: Path) -> EnvironmentConfig:
        from harbor.models.trial.config import EnvironmentConfig

        return EnvironmentConfig(type="docker", force_build=self.config.force_build)

    async def release(self, entry: ResourceEntry) -> str:
        return "docker sandboxes are Harbor's and not journalled: check `docker ps`"


class BlaxelProvider(ProviderAdapter):
    type = "blaxel"
    config_model = BlaxelProviderConfig
    modules = ("harbor", "blaxel")
    extra = "harbor-blaxel"
    environment_class = "loops_nb.providers.blaxel:JournalledBlaxelEnvironment"

    def backend_problems(self) -> list[str]:
        has_key = os.environ.get("BL_API_KEY") or os.environ.get("BL_CLIENT_CREDENTIALS")
        has_workspace = os.environ.get("BL_WORKSPACE")
        if (has_key and has_workspace) or (Path.home() / ".blaxel" / "config.yaml").is_file():
            return []
        missing = [v for v, ok in (("BL_API_KEY", has_key), ("BL_WORKSPACE", has_workspace)) if not ok]
        return [
            f"Blaxel credentials missing: set {' and '.join(missing)} (in the environment or .env), "
            "or run `bl login`"
        ]

    async def release(self, entry: ResourceEntry) -> str:
        from blaxel.core import SandboxInstance

        name = entry.provider_id or entry.detail.get("name")
        if not name:
            return "skipped: no sandbox name in the journal"
        try:
            await SandboxInstance.delete(name)
        except Exception as exc:
            if _not_found(exc):
                return f"already gone: {name}"
            raise
        return f"deleted Blaxel sandbox {name}"


class DaytonaProvider(ProviderAdapter):
    type = "daytona"
    config_model = DaytonaProviderConfig
    modules = ("harbor", "daytona")
    extra = "harbor-daytona"
    environment_class = "loops_nb.providers.daytona:JournalledDaytonaEnvironment"

    def backend_problems(self) -> list[str]:
        if os.environ.get("DAYTONA_API_KEY") or (
            os.environ.get("DAYTONA_JWT_TOKEN") and os.environ.get("DAYTONA_ORGANIZATION_ID")
        ):
            return []
        return [
            "Daytona credentials missing: set DAYTONA_API_KEY, or DAYTONA_JWT_TOKEN and "
            "DAYTONA_ORGANIZATION_ID (in the environment or .env)"
        ]

    async def release(self, entry: ResourceEntry) -> str:
        from daytona import AsyncDaytona, ListSandboxesQuery

        async with AsyncDaytona() as client:
            if entry.provider_id:
                try:
                    sandbox = await client.get(entry.provider_id)
                except Exception as exc:
                    if _not_found(exc):
                        return f"already gone: {entry.provider_id}"
                    raise
                await client.delete(sandbox)
                return f"deleted Daytona sandbox {entry.provider_id}"
            # Crashed between the request and the journal's `created`: find it by Harbor's label.
            session = entry.detail.get("session")
            if not session:
                return "skipped: no sandbox id or session in the journal"
            deleted = []
            async for sandbox in client.list(ListSandboxesQuery(labels={"harbor.session_id": session})):
                await client.delete(sandbox)
                deleted.append(sandbox.id)
            return (
                f"deleted Daytona sandbox(es) {', '.join(deleted)}"
                if deleted
                else f"none found for {session}"
            )


ADAPTERS: dict[str, type[ProviderAdapter]] = {
    adapter.type: adapter for adapter in (LocalProvider, DockerProvider, BlaxelProvider, DaytonaProvider)
}


def provider_adapter(name: str, providers: Mapping[str, ProviderConfig]) -> ProviderAdapter:
    """The adapter of `[providers.<name>]`; a built-in type's name works without a table."""
    config = providers.get(name)
    if config is None:
        if name not in ADAPTERS:
            known = sorted({*providers, *ADAPTERS})
            raise ConfigError(f"no [providers.{name}] table: add one, or use one of {known}")
        config = ADAPTERS[name].config_model()
    return ADAPTERS[config.type](name, config)
