"""The `local` provider: Harbor trials in bubblewrap sandboxes on this machine (no Docker, no network).

`LocalSandboxEnvironment` is a Harbor environment (`EnvironmentConfig(import_path=...)`). Each trial gets a
host directory behind the sandbox's writable paths and one long-lived `bwrap` whose namespaces every `exec`
shares, so background processes survive between commands. The task's Dockerfile is read, not built
(dockerfile_plan.py); what one sandbox cannot start is refused by name (local_task_fit.py).
docs/reference/harbor.md, "The local sandbox", has what it is and is not.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable
from functools import cached_property
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.trial.paths import EnvironmentPaths

from loops_nb.errors import SandboxError
from loops_nb.providers.bubblewrap import BubblewrapSandbox, bwrap_path
from loops_nb.providers.dockerfile_plan import read_dockerfile
from loops_nb.providers.journalled import JournalledSandbox
from loops_nb.providers.local_task_fit import sandbox_paths, static_problems
from loops_nb.providers.local_verifier import (
    PROBLEMS_FILE,
    VerifierCannotRun,
    is_verifier_command,
    verifier_env,
    verifier_failure,
)
from loops_nb.providers.provider_config import LocalProviderConfig
from loops_nb.providers.sandbox_session import SandboxDied

logger = logging.getLogger(__name__)


class LocalSandboxOptions(EnvironmentOptions, LocalProviderConfig):
    """Harbor's options of the environment: `[providers.local]`'s fields, and the run's journal."""

    loops_journal: str | None = None
    """The run's resource journal (set by loops_nb; absent when Harbor is used directly)."""


class TaskNeedsImage(SandboxError):
    """The task needs an image build, which the local sandbox cannot do."""


class LocalSandboxEnvironment(JournalledSandbox, BaseEnvironment):
    """A Harbor environment whose sandbox is bubblewrap on this machine."""

    options_model = LocalSandboxOptions
    provider = "local"

    _sandbox: BubblewrapSandbox | None = None
    _died: SandboxDied | None = None
    _tests_uploaded = False
    _ever_started = False

    @property
    def _options(self) -> LocalSandboxOptions:
        assert isinstance(self.options, LocalSandboxOptions)  # Harbor parses the kwargs into `options_model`
        return self.options

    @cached_property
    def _paths(self) -> EnvironmentPaths:
        return EnvironmentPaths.for_os(self.os)

    @staticmethod
    def type() -> str:
        return "loops-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(mounted=True, disable_internet=True)

    def _validate_definition(self) -> None:
        pass  # a task without environment/ is fine: the host is the image

    async def start(self, force_build: bool) -> None:
        options = self._options
        problems = static_problems(
            self.environment_name, self.environment_dir, self.task_env_config, options.ignore_dockerfile
        )
        if problems:  # the same lines `loops check` prints, so a bad task never reaches its first trial
            raise TaskNeedsImage(problems[0])
        bwrap_path()
        plan = read_dockerfile(self.environment_dir / "Dockerfile")
        scratch = Path(options.scratch_dir or tempfile.gettempdir()) / "loops_nb_sandboxes"
        root = scratch / f"{self.session_id}-{uuid.uuid4().hex[:8]}"
        self._journal_intent(session=self.session_id, task=self.environment_name, path=str(root))
        workdir, writable = sandbox_paths(plan, self.task_env_config)
        host_binds = {
            str(m["target"]): Path(m["source"]) for m in self._host_mounts if m.get("type") == "bind"
        }
        no_network = options.network == "none" or self._network_disabled
        self._sandbox = BubblewrapSandbox(
            root,
            writable,
            workdir,
            network=not no_network,
            hidden=options.hidden_paths,
            host_binds=host_binds,
        )
        self._ever_started = True
        self._sandbox.create()
        self._journal_created(str(root), path=str(root))
        await self._sandbox.start()
        task_env = {**plan.env, **(self.task_env_config.env or {})}
        self._persistent_env: dict[str, str] = {**task_env, **self._persistent_env}
        for source, dest in plan.copies:  # static_problems() checked sources and destinations
            await self._copy_in((self.environment_dir / source).resolve(), dest)

    async def _copy_in(self, source: Path, target: str) -> None:
        try:
            host = self._require().host_path(target)
        except FileNotFoundError as exc:
            raise TaskNeedsImage(
                f"task {self.environment_name}: Dockerfile COPY to {target}: {exc}"
            ) from None
        if source.is_dir():
            await asyncio.to_thread(shutil.copytree, source, host, dirs_exist_ok=True)
        else:
            if target.endswith("/") or host.is_dir():
                host = host / source.name
            host.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(shutil.copy2, source, host)

    def _require(self) -> BubblewrapSandbox:
        """The running sandbox; SandboxDied when it died earlier in this trial or its directory is gone."""
        if self._died is not None:
            # A dead sandbox stays dead: an agent that swallowed the first error must not go on, nor
            # its verifier grade what is left, even where a later upload recreates part of the tree.
            raise SandboxDied(f"{self._died} (earlier in this trial)")
        if self._sandbox is None:
            raise RuntimeError("the local sandbox is not started")
        try:
            self._sandbox.check()
        except SandboxDied as exc:
            self._died = exc
            raise
        return self._sandbox

    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        options = self._options
        if sandbox is None:
            return
        await sandbox.stop()  # every process of the trial, its background ones too, dies here
        if options.keep_sandboxes:
            return
        if await asyncio.to_thread(sandbox.remove):
            self._journal_released()
        else:
            # Never journal a removal that did not happen: the entry stays live for `loops cleanup`.
            logger.warning(
                "could not remove the local sandbox %s; it stays live in the journal for `loops cleanup`",
                sandbox.root,
            )

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        sandbox = self._require()
        merged = self._merge_env(env)
        paths = self._paths
        verifier = self._tests_uploaded and is_verifier_command(command, paths.tests_dir, paths.verifier_dir)
        if verifier:  # the offline tools (local_verifier.py), and a fresh problems file
            sandbox.host_path(str(paths.verifier_dir / PROBLEMS_FILE)).unlink(missing_ok=True)
            merged = verifier_env(merged, paths.verifier_dir, "host" if sandbox.network else "none")
        try:
            result = await sandbox.run(command, cwd, merged, timeout_sec)
        except TimeoutError:
            raise RuntimeError(f"command timed out after {timeout_sec} seconds: {command[:200]}") from None
        except SandboxDied as exc:
            self._died = exc  # every later exec, upload and download raises too (see _require)
            raise
        if verifier:
            why = verifier_failure(result.return_code, sandbox.host_path(str(paths.verifier_dir)))
            if why:
                raise VerifierCannotRun(why)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.return_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        host = self._require().host_path(target_path)
        host.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, source_path, host)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        # Harbor uploads the tests right before the verifier runs: only after it is a command the verifier.
        self._tests_uploaded |= PurePosixPath(target_dir) == self._paths.tests_dir
        host = self._require().host_path(target_dir)
        await asyncio.to_thread(shutil.copytree, source_dir, host, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        if host := self._download_source(source_path, Path.is_file):
            Path(target_path).parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(shutil.copy2, host, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        host = self._download_source(source_dir, Path.is_dir)
        # Auto-mounted: the sandbox wrote straight into the trial directory.
        if host and host.resolve() != Path(target_dir).resolve():
            await asyncio.to_thread(shutil.copytree, host, target_dir, dirs_exist_ok=True)

    def _download_source(self, source: str, exists: Callable[[Path], bool]) -> Path | None:
        """The host path to download `source` from; None when the sandbox never started (Harbor still asks
        for the agent's logs: one quiet no-op beats a traceback per attempt, whose detail says why)."""
        if self._sandbox is None and self._died is None and not self._ever_started:
            return None
        host = self._require().host_path(source)
        if not exists(host):
            raise FileNotFoundError(f"{source} does not exist in the sandbox")
        return host
