"""The RolloutRuntime contract: what runs attempts, and the attempt and evidence types it receives.

A run schedules attempts (one agent episode on one task) on a runtime. The runtime runs the agent in
its environment; every model call goes through the attempt's model access, which records the exact
tokens; the environment's verifier scores the episode, and the runtime returns `Evidence`. loops_nb
turns evidence into GRPO training data. Harbor is one runtime; an Episode class is another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from loops_nb.discard_reason import DiscardReason
from loops_nb.llm.chat_messages import ChatMessage

if TYPE_CHECKING:
    from loops_nb.llm.capture import TokenCapture
    from loops_nb.llm.client import LoopsLLM
    from loops_nb.llm.renderer import Renderer
    from loops_nb.resources import ResourceRegistry


class ModelAccessMode(StrEnum):
    """How a runtime's agents reach the model (`loops_nb.model_access` serves the HTTP mode)."""

    IN_PROCESS = "in_process"
    """The agent runs in this process and calls `llm()` / `attempt.services.llm`."""
    OPENAI_HTTP = "openai_http"
    """The agent is its own program and calls the gateway at `attempt.services.model_base_url`."""


@dataclass(frozen=True)
class Task:
    """One thing to attempt. `data` is whatever the agent and the verifier need (a prompt, an answer)."""

    id: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class AttemptServices:
    """What an attempt may use: the model (in-process handle), and the run's resource registry."""

    llm: LoopsLLM
    capture: TokenCapture
    resources: ResourceRegistry | None = None
    model_base_url: str | None = None
    """For an agent that is its own program: the OpenAI-compatible URL of this attempt's lease."""
    model_api_key: str | None = None
    evidence_kept: list[str] = field(default_factory=list)
    """Where the runtime keeps this attempt's evidence (e.g. `trial directory: <path>`); a discarded
    attempt's detail names each, however it ended, a timeout included."""


@dataclass
class Attempt:
    """One episode of one task, identified within its group."""

    task: Task
    group: int
    index: int
    seed: int
    policy_version: int
    services: AttemptServices

    @property
    def id(self) -> str:
        return f"{self.task.id}/g{self.group}/a{self.index}"


@dataclass
class Evidence:
    """What an attempt produced: its reward, or why it must not train."""

    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    discarded: DiscardReason | str | None = None
    """Why the attempt must not train (a `DiscardReason`, or a runtime's own name); its group still counts it."""
    detail: str = ""
    """Human detail for a discard: the exception, the missing reward file, ..."""
    transcript: list[ChatMessage] = field(default_factory=list)
    """The conversation as the agent saw it (messages, tool calls, tool results)."""

    @classmethod
    def discard(cls, reason: DiscardReason | str, detail: str = "", **metrics: float) -> Evidence:
        return cls(reward=None, discarded=reason, detail=detail, metrics=dict(metrics))


@dataclass
class RunContext:
    """What a run offers a runtime beyond its options. A runtime with a `bind(context)` method gets it
    before `tasks()` is first called, in `loops check` as in `loops run`."""

    config_dir: Path
    """The training config's directory: relative paths in `[runtime.options]` are relative to it."""
    state_dir: Path
    """The run's state directory (or check's preflight directory): the resource journal lives here."""
    providers: Mapping[str, Any] = field(default_factory=dict)
    """`[providers.<name>]` tables (loops_nb.providers.provider_config models), by name."""
    resources: ResourceRegistry | None = None
    """The run's resource registry, journalled under `state_dir`."""
    checking: bool = False
    """True under `loops check`: prepare and validate, but create no sandbox."""


class CheckWarning(str):
    """A line of `preflight()` that `loops check` prints as a warning: the run can start, but something
    will go wrong (e.g. a verifier that needs network the sandbox does not have)."""


class RolloutRuntime:
    """Runs attempts. Implementations: `loops_nb.episodes.EpisodeRuntime`, `loops_nb.harbor.HarborRuntime`.

    Subclass it and implement `tasks` and `run_attempt`; the other hooks have defaults. A class written
    without subclassing it (any object with `tasks`, `run_attempt` and `close`) is adapted by
    `load_runtime` (`AdaptedRuntime`), so the run only ever talks to this interface.
    """

    model_access: ModelAccessMode = ModelAccessMode.IN_PROCESS
    """How the runtime's agents reach the model; `openai_http` makes the run start its model gateway."""

    async def tasks(self) -> Sequence[Task]:
        """Every task of the run, in a stable order (the scheduler samples and repeats them)."""
        raise NotImplementedError(f"{type(self).__name__} must define async tasks()")

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        """Run one attempt to completion and return its evidence; raising discards it as `error`."""
        raise NotImplementedError(f"{type(self).__name__} must define async run_attempt(attempt)")

    async def close(self) -> None:
        """Release what the runtime holds (sandboxes, processes)."""
        return None

    def bind(self, context: RunContext) -> None:
        """Take the run's context (config directory, providers, state, resources) before `tasks()` is
        first called, in `loops check` as in `loops run`."""
        return None

    async def preflight(self) -> list[str]:
        """Problems `loops check` reports before any attempt runs (a missing image, a bad task); a
        `CheckWarning` among them is printed as a warning and does not fail the check."""
        return []

    async def check_lines(self, renderer: Renderer | None) -> tuple[list[str], list[str]]:
        """`loops check`'s last step, after `preflight()`, the tasks and the first prompts: lines to print and
        problems that fail the check (the verifiers runtime plays one episode through the gateway). None
        by default."""
        return [], []

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        """A task's first prompt, for `loops check` to render and count (None: not known in advance)."""
        return None

    async def agent_time_limits(self) -> Sequence[AgentTimeLimit]:
        """Each task's time limit for its agent and the model calls it expects, for `loops check` to compare
        with how long a call takes on the local scope (none: the runtime sets no such limit)."""
        return ()


@dataclass(frozen=True)
class AgentTimeLimit:
    """A task's time limit for its agent, beside the model calls the agent is expected to make in it."""

    task: str
    seconds: float
    set_by: str
    """The setting that sets it, as a user would change it (`[agent] timeout_sec in task.toml`)."""
    calls: int
    """Model calls an episode is expected to make (the agent's turn limit, or its least)."""
    calls_set_by: str
    first_prompt: str
    """The text of the first prompt beyond the chat template, for its token count."""


@runtime_checkable
class RuntimeShape(Protocol):
    """What a runtime written without subclassing `RolloutRuntime` must have."""

    async def tasks(self) -> Sequence[Task]: ...

    async def run_attempt(self, attempt: Attempt) -> Evidence: ...

    async def close(self) -> None: ...


class AdaptedRuntime(RolloutRuntime):
    """A `RuntimeShape` object as a `RolloutRuntime`: its optional hooks are looked up once, here, so the
    run never probes a runtime for them."""

    def __init__(self, inner: RuntimeShape) -> None:
        self.inner = inner
        self.model_access = ModelAccessMode(getattr(inner, "model_access", ModelAccessMode.IN_PROCESS))
        self._bind = getattr(inner, "bind", None)
        self._preflight = getattr(inner, "preflight", None)
        self._check_lines = getattr(inner, "check_lines", None)
        self._prompt_messages = getattr(inner, "prompt_messages", None)
        self._agent_time_limits = getattr(inner, "agent_time_limits", None)

    async def tasks(self) -> Sequence[Task]:
        return await self.inner.tasks()

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        return await self.inner.run_attempt(attempt)

    async def close(self) -> None:
        await self.inner.close()

    def bind(self, context: RunContext) -> None:
        if self._bind is not None:
            self._bind(context)

    async def preflight(self) -> list[str]:
        return list(await self._preflight()) if self._preflight is not None else []

    async def check_lines(self, renderer: Renderer | None) -> tuple[list[str], list[str]]:
        return await self._check_lines(renderer) if self._check_lines is not None else ([], [])

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        return self._prompt_messages(task) if self._prompt_messages is not None else None

    async def agent_time_limits(self) -> Sequence[AgentTimeLimit]:
        return list(await self._agent_time_limits()) if self._agent_time_limits is not None else ()
