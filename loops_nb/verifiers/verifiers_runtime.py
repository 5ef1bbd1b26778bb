"""`VerifiersRuntime`: any verifiers environment as a RolloutRuntime, each episode out of process.

`[runtime] factory = "loops_nb.verifiers:create_runtime"` with `[runtime.options]` (options.py). `tasks()` are
what the episode driver lists; each attempt is one driver `run` (or one episode of the shared `serve`) whose
model calls reach the attempt's gateway lease: docs/reference/verifiers.md, "How an episode's calls reach the
sampler".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loops_nb.errors import ConfigError, UserError
from loops_nb.llm.chat_messages import ChatMessage
from loops_nb.model_access.mode import ModelAccessMode
from loops_nb.runtime import Attempt, CheckWarning, Evidence, RolloutRuntime, RunContext, Task
from loops_nb.verifiers.check_call import check_episode
from loops_nb.verifiers.driver_process import (
    DRIVER,
    LOAD_FAILED,
    DriverOutcome,
    attempt_env,
    driver_env,
    run_driver,
)
from loops_nb.verifiers.environment_build import VerifiersEnvironment, verifiers_environment
from loops_nb.verifiers.episode_result import evidence_from_episode
from loops_nb.verifiers.episode_server import EpisodeServer, ServerGone
from loops_nb.verifiers.listing import EnvironmentListing
from loops_nb.verifiers.options import DEFAULT_VERIFIERS, VerifiersOptions

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer

log = logging.getLogger(__name__)


class VerifiersRuntime(RolloutRuntime):
    """Runs each attempt as one episode of a verifiers environment, in the verifiers interpreter."""

    model_access = ModelAccessMode.OPENAI_HTTP

    def __init__(self, options: VerifiersOptions) -> None:
        self.options = options
        self.context: RunContext | None = None
        self._environment: VerifiersEnvironment | None = None
        self._listing: EnvironmentListing | None = None
        self._failure: str | None = None
        self._lock = asyncio.Lock()
        self._build_lock = asyncio.Lock()
        self._server: EpisodeServer | None = None
        self._server_lock = asyncio.Lock()

    def bind(self, context: RunContext) -> None:
        self.context = context

    # -- the environment --------------------------------------------------------------------------
    async def environment(self) -> VerifiersEnvironment:
        """The verifiers interpreter: `python` as given, else the cached build (built on first use)."""
        async with self._build_lock:  # attempts that start together wait on one build
            if self._environment is None:
                self._environment = await self._build()
        return self._environment

    def _config_path(self, value: str) -> Path:
        """A path of the options, `~` expanded, relative to the config's directory (an absolute one as it is)."""
        path = Path(value).expanduser()
        return path if self.context is None else self.context.config_dir / path

    async def _build(self) -> VerifiersEnvironment:
        # A package starting with one of these is a local directory; any other a requirement.
        packages = [
            str(self._config_path(p).resolve()) if p.startswith((".", "/", "~")) else p
            for p in self.options.packages
        ]
        cache_dir = self.options.cache_dir
        return await verifiers_environment(
            [self.options.verifiers, *packages],
            python=self.options.python,
            cache_dir=None if cache_dir is None else str(self._config_path(cache_dir)),
            timeout=self.options.build_timeout_seconds,
        )

    def _driver(self) -> str:
        return str(DRIVER if self.options.driver is None else self._config_path(self.options.driver))

    def _load_args(self) -> list[str]:
        """What the driver loads the environment with."""
        args = ["--env", self.options.env_id, "--env-args", json.dumps(self.options.env_args)]
        args += ["--split", self.options.split]
        args += [] if self.options.harness is None else ["--harness", json.dumps(self.options.harness)]
        return args + ([] if self.options.limit is None else ["--limit", str(self.options.limit)])

    async def listing(self) -> EnvironmentListing:
        """The environment loaded once: its verifiers version, rubric and tasks (UserError, one line, when
        it cannot load)."""
        async with self._lock:
            if self._failure is not None:  # said once; loading again would take as long to fail again
                raise UserError(self._failure)
            if self._listing is None:
                try:
                    self._listing = await self._list()
                except UserError as exc:
                    self._failure = str(exc)
                    raise
        return self._listing

    async def _list(self) -> EnvironmentListing:
        if self.options.episodes == "shared":  # the shared process lists as it starts: one load, not two
            try:
                outcome = DriverOutcome(0, (await self._shared_server()).ready, "")
            except ServerGone as gone:
                outcome = gone.outcome
        else:
            environment = await self.environment()
            argv = [str(environment.python), self._driver(), "list", *self._load_args()]
            env = driver_env(tuple(self.options.pass_env), self.options.offline)
            outcome = await run_driver(argv, timeout=self.options.load_timeout_seconds, env=env)
        timeout = self.options.load_timeout_seconds
        name = f"verifiers environment {self.options.env_id!r}"
        if outcome.timed_out:
            raise UserError(
                f"{name}: loading it and listing its tasks ran past runtime.options.load_timeout_seconds "
                f"({timeout:g}s)"
            )
        if outcome.returncode == LOAD_FAILED:
            raise UserError(f"{name} cannot load: {outcome.reason() or 'the driver gave no reason'}")
        if outcome.returncode != 0:
            log.info("episode driver list failed:\n%s", outcome.stderr)
            raise UserError(f"{name}: the verifiers process exited {outcome.returncode}: {outcome.reason()}")
        if outcome.result is None:
            raise UserError(f"{name}: the episode driver's list gave no result: {outcome.unreadable}")
        return EnvironmentListing.parse(outcome.result, name)

    # -- RolloutRuntime ---------------------------------------------------------------------------
    async def tasks(self) -> Sequence[Task]:
        return (await self.listing()).tasks

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        prompt = task.data.get("prompt")
        return list(prompt) if isinstance(prompt, list) and prompt else None

    async def preflight(self) -> list[str]:
        """`loops check`: the environment builds and loads, its verifiers version is tested, its rubric has
        reward functions (each refusal one line). An environment that cannot build or load is said by
        `tasks()`, which check calls next. The first call through the gateway is check_call.py's."""
        try:
            listing = await self.listing()
        except UserError:
            return []
        return [*listing.problems(), *(CheckWarning(w) for w in listing.warnings())]

    async def check_lines(self, renderer: Renderer | None) -> tuple[list[str], list[str]]:
        """`loops check`'s lines and problems: the tasks and rubric, and one episode through the gateway."""
        try:
            listing = await self.listing()
        except Exception:  # preflight already reported it
            return [], []
        return await check_episode(listing, self, self.options.model, renderer)

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        url = attempt.services.model_base_url
        if not url:
            raise RuntimeError("the verifiers runtime needs the model gateway (model access openai_http)")
        timeout = self.options.episode_timeout_seconds
        if self.options.episodes == "shared":
            outcome = await self._shared_episode(attempt, url)
        else:
            argv = [str((await self.environment()).python), self._driver(), "run", *self._load_args()]
            argv += ["--task-id", attempt.task.id, "--base-url", url, "--model", self.options.model]
            argv += ["--sampling", json.dumps(self.options.sampling)]
            env = attempt_env(attempt, tuple(self.options.pass_env), self.options.offline)
            outcome = await run_driver(argv, timeout=timeout, env=env, attempt=attempt)
        if outcome.returncode not in (0, None):
            log.info("verifiers episode %s exited %s:\n%s", attempt.id, outcome.returncode, outcome.stderr)
        prompt = attempt.task.data.get("prompt")
        return evidence_from_episode(outcome, timeout, prompt if isinstance(prompt, list) else None)

    async def _shared_server(self) -> EpisodeServer:
        """The shared verifiers process, started (or restarted) on demand; ServerGone when it cannot load."""
        async with self._server_lock:
            if self._server is None or not self._server.alive:
                environment = await self.environment()
                argv = [str(environment.python), self._driver(), "serve", *self._load_args()]
                server = EpisodeServer(argv, driver_env(tuple(self.options.pass_env), self.options.offline))
                await server.start(self.options.load_timeout_seconds)
                self._server = server
            return self._server

    async def _shared_episode(self, attempt: Attempt, url: str) -> DriverOutcome:
        """The attempt's episode in the shared verifiers process."""
        try:
            server = await self._shared_server()
        except ServerGone as gone:
            return gone.outcome
        request: dict[str, object] = {
            "task_id": attempt.task.id,
            "base_url": url,
            "model": self.options.model,
            "sampling": self.options.sampling,
            "api_key": attempt.services.model_api_key,
        }
        return await server.run(request, self.options.episode_timeout_seconds)

    async def close(self) -> None:
        """Stop the shared verifiers process, if any (a per-attempt one ends with its attempt)."""
        if self._server is not None:
            await self._server.stop()
            self._server = None


def create_runtime(**options: object) -> VerifiersRuntime:
    """`[runtime] factory = "loops_nb.verifiers:create_runtime"`: `[runtime.options]` are VerifiersOptions."""
    parsed = VerifiersOptions.parse(options)
    if not parsed.verifiers.strip():
        raise ConfigError(f"runtime.options.verifiers: a requirement such as {DEFAULT_VERIFIERS!r}")
    return VerifiersRuntime(parsed)
