"""The Episode API: the smallest custom runtime (docs/reference/episode_api.md).

An Episode class lists its tasks (`tasks()`) and runs one attempt at a task (`async run(task)`), calling the
model through `llm()` and returning its reward. `[runtime] factory = "episode:HiddenGame"` names it and
`[runtime] options` become its constructor's keyword arguments; loops_nb runs it as a `RolloutRuntime`
(`EpisodeRuntime`), and each `llm()` call is captured exactly.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loops_nb.errors import ConfigError, UserError
from loops_nb.llm.chat_messages import ChatMessage
from loops_nb.llm.client import bind_llm, unbind_llm
from loops_nb.runtime import (
    AdaptedRuntime,
    Attempt,
    Evidence,
    ModelAccessMode,
    RolloutRuntime,
    RuntimeShape,
    Task,
)

__all__ = ["Episode", "EpisodeRuntime", "Evidence", "Task", "load_runtime", "run_blocking"]

log = logging.getLogger(__name__)


async def run_blocking[**P, R](fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """`await run_blocking(subprocess.run, cmd)`: run blocking code (a subprocess, `requests`, a slow
    verifier) in a thread, so the other attempts, which share one event loop, keep running. This is
    `asyncio.to_thread`, where an Episode author looks for it; the thread gets the attempt's context, so
    `llm()` still names its model (docs/reference/episode_api.md#blocking-code)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class Episode:
    """Subclass and implement `tasks()` and `async run(task) -> float | Evidence`."""

    model_access: ModelAccessMode = ModelAccessMode.IN_PROCESS
    """`openai_http` when `run` launches the agent as its own program (`model_env()` gives it its lease)."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def tasks(self) -> Sequence[Task | dict[str, Any] | str]:
        """The tasks to attempt: `Task`s, dicts with an `id`, or plain strings (used as id and prompt)."""
        raise NotImplementedError(f"{type(self).__name__} must define tasks()")

    async def run(self, task: Task) -> float | Evidence:
        """One attempt: call the model with `llm()`, return the reward (or `Evidence`)."""
        raise NotImplementedError(f"{type(self).__name__} must define async run(task)")

    async def close(self) -> None:
        """Release anything the episode holds; called once when the run ends."""

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        """The task's first prompt, for `loops check` to render and count (None: not known in advance)."""
        return None


def _as_task(item: Task | dict[str, Any] | str, index: int) -> Task:
    if isinstance(item, Task):
        return item
    if isinstance(item, str):
        return Task(id=item, data={"prompt": item})
    if isinstance(item, dict):
        data = dict(item)
        return Task(id=str(data.pop("id", index)), data=data)
    raise ConfigError(f"task {index}: expected a Task, a dict or a string, got {type(item).__name__}")


class EpisodeRuntime(RolloutRuntime):
    """Runs an Episode's attempts in-process, with `llm()` bound to the attempt's model handle."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.model_access = ModelAccessMode(episode.model_access)
        self._tasks: list[Task] | None = None

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        return self.episode.prompt_messages(task)

    async def tasks(self) -> Sequence[Task]:
        if self._tasks is None:
            produced = self.episode.tasks()
            if inspect.isawaitable(produced):
                produced = await produced
            self._tasks = [_as_task(t, i) for i, t in enumerate(produced)]
            if not self._tasks:
                raise ConfigError(f"{type(self.episode).__name__}.tasks() returned no tasks")
        return self._tasks

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        token = bind_llm(attempt.services.llm)
        try:
            result = await self.episode.run(attempt.task)
        finally:
            unbind_llm(token)
        # Unconverted: the scheduler's attempt boundary refuses a bool, a string or an out-of-range number
        # with a reason, where float() here would train True as 1.0 or raise on "0.5".
        return result if isinstance(result, Evidence) else Evidence(reward=result)

    async def close(self) -> None:
        await self.episode.close()


def import_object(path: str, key: str = "runtime.factory") -> Any:
    """`module:name` -> the object; a clear ConfigError when either part is missing."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f'{key} = {path!r}: expected `module:name`, e.g. "episode:HiddenGame"')
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{key} = {path!r}: cannot import {exc.name!r} (modules beside the config are importable)"
        ) from None
    except SystemExit as exc:
        raise ConfigError(
            f"{key} = {path!r}: importing module {module_name!r} called sys.exit({exc.code!r}); "
            "a module a config names must not exit when imported"
        ) from None
    except Exception as exc:
        log.info("importing %s failed", module_name, exc_info=exc)  # the whole traceback under `-v`
        raise ConfigError(
            f"{key} = {path!r}: importing module {module_name!r} raised {_raised(exc)}"
        ) from None
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"{key} = {path!r}: module {module_name!r} has no {attr!r}") from None
    return obj


def _raised(exc: BaseException) -> str:
    """`Type: message (file:line)`, the line being the innermost frame of the user's code that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and "/loops_nb/" not in f.filename]
    where = f" ({Path(user[-1].filename).name}:{user[-1].lineno})" if user else ""
    return f"{type(exc).__name__}: {exc}{where}"


def load_runtime(factory: str, options: Mapping[str, object]) -> RolloutRuntime:
    """Build the runtime `[runtime] factory` names: an Episode subclass, or a RolloutRuntime factory."""
    obj = import_object(factory)
    if not callable(obj):
        raise ConfigError(f"runtime.factory = {factory!r} is a {type(obj).__name__}, not a class or function")
    try:
        signature = inspect.signature(obj)
        signature.bind(**options)
    except TypeError as exc:
        raise ConfigError(
            f"runtime.options do not fit {factory}: {exc} (given {sorted(options) or 'none'}; "
            f"it takes {signature})"
        ) from None
    except ValueError:  # no signature to check (a builtin): calling it says
        pass
    try:
        runtime = obj(**options)
    except UserError:
        raise
    except Exception as exc:
        log.info("%s(**runtime.options) failed", factory, exc_info=exc)
        raise ConfigError(f"runtime.factory = {factory!r}: constructing it raised {_raised(exc)}") from None
    if isinstance(runtime, Episode):
        return EpisodeRuntime(runtime)
    if isinstance(runtime, RolloutRuntime):
        return runtime
    if isinstance(runtime, RuntimeShape):
        return AdaptedRuntime(runtime)
    raise ConfigError(
        f"runtime.factory = {factory!r} returned {type(runtime).__name__}, not a RolloutRuntime or Episode"
    )
