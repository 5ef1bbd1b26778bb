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
from pathlib import Path
from typing import Any, Protocol

from loops_nb.errors import ConfigError
from loops_nb.providers.bubblewrap import SandboxUnavailable, bwrap_path, remove_tree
from loops_nb.providers.provider_config import (
    BlaxelProviderConfig,
    DaytonaProviderConfig,
    DockerProviderConfig,
    LocalProviderConfig,
)
from loops_nb.resources import ResourceEntry

SANDBOX_DIR_NAME = "loops_nb_sandboxes"


class ProviderAdapter(Protocol):
    name: str
    type: str

    def problems(self) -> list[str]:
        """What stops this provider from working here (missing extra, credentials, tools); [] if none."""
        ...

    def harbor_environment(self, journal: Path) -> dict[str, Any]:
        """Harbor `EnvironmentConfig` fields for a trial whose sandboxes go in `journal`."""
        ...

    async def release(self, entry: ResourceEntry) -> str:
        """Release a journalled resource; returns what was done, for the cleanup report."""
        ...


def _missing_extra(module: str, extra: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"the {extra} extra is not installed: `uv sync --extra {extra}`"
    return None


class LocalProvider:
    type = "local"

    def __init__(self, name: str, config: LocalProviderConfig) -> None:
        self.name, self.config = name, config

    def problems(self) -> list[str]:
        missing = _missing_extra("harbor", "harbor")
        if missing:
            return [f"providers.{self.name}: {missing}"]
        try:
            bwrap = bwrap_path()
        except SandboxUnavailable as exc:
            return [f"providers.{self.name}: {exc}"]
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            return [
                f"providers.{self.name}: bubblewrap cannot create a sandbox here ({probe.stderr.strip()[:200]}); "
                "it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root"
            ]
        return []

    def scratch_root(self) -> Path:
        base = self.config.scratch_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        return Path(base).resolve()

    def harbor_environment(self, journal: Path) -> dict[str, Any]:
        return {
            "import_path": "loops_nb.providers.local:LocalSandboxEnvironment",
            "kwargs": {
                "loops_journal": str(journal),
                "scratch_dir": str(self.scratch_root()),
                "network": self.config.network,
                "hidden_paths": list(self.config.hidden_paths),
                "ignore_dockerfile": self.config.ignore_dockerfile,
                "keep_sandboxes": self.config.keep_sandboxes,
            },
        }

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


class DockerProvider:
    type = "docker"

    def __init__(self, name: str, config: DockerProviderConfig) -> None:
        self.name, self.config = name, config

    def problems(self) -> list[str]:
        missing = _missing_extra("harbor", "harbor")
        if missing:
            return [f"providers.{self.name}: {missing}"]
        if shutil.which("docker") is None:
            return [
                f"providers.{self.name}: the docker CLI is not on PATH; install Docker, or use the local "
                "provider (bubblewrap) or blaxel/daytona"
            ]
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
        if info.returncode != 0:
            return [f"providers.{self.name}: the Docker daemon is not reachable (`docker info` failed)"]
        return []

    def harbor_environment(self, journal: Path) -> dict[str, Any]:
        return {"type": "docker", "force_build": self.config.force_build}

    async def release(self, entry: ResourceEntry) -> str:
        return "docker sandboxes are Harbor's and not journalled: check `docker ps`"


class BlaxelProvider:
    type = "blaxel"

    def __init__(self, name: str, config: BlaxelProviderConfig) -> None:
        self.name, self.config = name, config

    def problems(self) -> list[str]:
        for module, extra in (("harbor", "harbor-blaxel"), ("blaxel", "harbor-blaxel")):
            missing = _missing_extra(module, extra)
            if missing:
                return [f"providers.{self.name}: {missing}"]
        has_key = os.environ.get("BL_API_KEY") or os.environ.get("BL_CLIENT_CREDENTIALS")
        has_workspace = os.environ.get("BL_WORKSPACE")
        login = Path.home() / ".blaxel" / "config.yaml"
        if (has_key and has_workspace) or login.is_file():
            return []
        missing_vars = [v for v, ok in (("BL_API_KEY", has_key), ("BL_WORKSPACE", has_workspace)) if not ok]
        return [
            f"providers.{self.name}: Blaxel credentials missing: set {' and '.join(missing_vars)} "
            "(in the environment or .env), or run `bl login`"
        ]

    def harbor_environment(self, journal: Path) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"loops_journal": str(journal)}
        if self.config.region:
            kwargs["region"] = self.config.region
        if self.config.ttl:
            kwargs["ttl"] = self.config.ttl
        return {"import_path": "loops_nb.providers.blaxel:JournalledBlaxelEnvironment", "kwargs": kwargs}

    async def release(self, entry: ResourceEntry) -> str:
        from blaxel.core import SandboxInstance

        name = entry.provider_id or entry.detail.get("name")
        if not name:
            return "skipped: no sandbox name in the journal"
        try:
            await SandboxInstance.delete(name)
        except Exception as exc:
            if "not found" in str(exc).lower() or "404" in str(exc):
                return f"already gone: {name}"
            raise
        return f"deleted Blaxel sandbox {name}"


class DaytonaProvider:
    type = "daytona"

    def __init__(self, name: str, config: DaytonaProviderConfig) -> None:
        self.name, self.config = name, config

    def problems(self) -> list[str]:
        for module, extra in (("harbor", "harbor-daytona"), ("daytona", "harbor-daytona")):
            missing = _missing_extra(module, extra)
            if missing:
                return [f"providers.{self.name}: {missing}"]
        if os.environ.get("DAYTONA_API_KEY"):
            return []
        if os.environ.get("DAYTONA_JWT_TOKEN") and os.environ.get("DAYTONA_ORGANIZATION_ID"):
            return []
        return [
            f"providers.{self.name}: Daytona credentials missing: set DAYTONA_API_KEY, or DAYTONA_JWT_TOKEN "
            "and DAYTONA_ORGANIZATION_ID (in the environment or .env)"
        ]

    def harbor_environment(self, journal: Path) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"loops_journal": str(journal)}
        if self.config.auto_stop_interval_mins is not None:
            kwargs["auto_stop_interval_mins"] = self.config.auto_stop_interval_mins
        if self.config.ttl_minutes is not None:
            kwargs["ttl_minutes"] = self.config.ttl_minutes
        return {"import_path": "loops_nb.providers.daytona:JournalledDaytonaEnvironment", "kwargs": kwargs}

    async def release(self, entry: ResourceEntry) -> str:
        from daytona import AsyncDaytona, ListSandboxesQuery

        async with AsyncDaytona() as client:
            if entry.provider_id:
                try:
                    sandbox = await client.get(entry.provider_id)
                except Exception as exc:
                    if "not found" in str(exc).lower() or "404" in str(exc):
                        return f"already gone: {entry.provider_id}"
                    raise
                await client.delete(sandbox)
                return f"deleted Daytona sandbox {entry.provider_id}"
            # Crashed between the request and the journal's `created`: find it by Harbor's label.
            session = entry.detail.get("session")
            if not session:
                return "skipped: no sandbox id or session in the journal"
            deleted = []
            query = ListSandboxesQuery(labels={"harbor.session_id": session})
            async for sandbox in client.list(query):
                await client.delete(sandbox)
                deleted.append(sandbox.id)
            return (
                f"deleted Daytona sandbox(es) {', '.join(deleted)}"
                if deleted
                else f"none found for {session}"
            )


ADAPTERS = {
    "local": LocalProvider,
    "docker": DockerProvider,
    "blaxel": BlaxelProvider,
    "daytona": DaytonaProvider,
}


def provider_adapter(name: str, providers: dict[str, Any]) -> ProviderAdapter:
    """The adapter of `[providers.<name>]`; a built-in type's name works without a table."""
    config = providers.get(name)
    if config is None:
        if name not in ADAPTERS:
            known = sorted({*providers, *ADAPTERS})
            raise ConfigError(f"no [providers.{name}] table: add one, or use one of {known}")
        default = {
            "local": LocalProviderConfig,
            "docker": DockerProviderConfig,
            "blaxel": BlaxelProviderConfig,
            "daytona": DaytonaProviderConfig,
        }[name]
        config = default()
    return ADAPTERS[config.type](name, config)
