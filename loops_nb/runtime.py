"""The RolloutRuntime contract: what runs attempts, and the attempt and evidence types it receives.

A run schedules attempts (one agent episode on one task) on a runtime. The runtime runs the agent in
its environment; every model call goes through the attempt's model access, which records the exact
tokens; the environment's verifier scores the episode, and the runtime returns `Evidence`. loops_nb
turns evidence into GRPO training data. Harbor is one runtime; an Episode class is another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from loops_nb.llm.capture import TokenCapture
    from loops_nb.llm.client import LoopsLLM
    from loops_nb.resources import ResourceRegistry


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
    resources: Any = None
    model_base_url: str | None = None
    """For an agent that is its own program: the OpenAI-compatible URL of this attempt's lease."""
    model_api_key: str | None = None


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


DiscardReason = Literal[
    "error",
    "timeout",
    "no_model_calls",
    "no_reward",
    "invalid_reward",
    "blocked_loop",
    "stale",
    "verifier_error",
    "truncated",
]


@dataclass
class Evidence:
    """What an attempt produced: its reward, or why it must not train."""

    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    discarded: str | None = None
    """A reason (see DiscardReason) when the attempt must not train; its group still counts it."""
    detail: str = ""
    """Human detail for a discard: the exception, the missing reward file, ..."""
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as the agent saw it (messages, tool calls, tool results)."""

    @classmethod
    def discard(cls, reason: str, detail: str = "", **metrics: float) -> Evidence:
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
    """`[providers.<name>]` tables (loops_nb.providers.config models), by name."""
    resources: ResourceRegistry | None = None
    """The run's resource registry, journalled under `state_dir`."""
    checking: bool = False
    """True under `loops check`: prepare and validate, but create no sandbox."""


@runtime_checkable
class RolloutRuntime(Protocol):
    """Runs attempts. Implementations: `loops_nb.episodes.EpisodeRuntime`, `loops_nb.harbor`."""

    async def tasks(self) -> Sequence[Task]:
        """Every task of the run, in a stable order (the scheduler samples and repeats them)."""
        ...

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        """Run one attempt to completion and return its evidence; raising discards it as `error`."""
        ...

    async def close(self) -> None:
        """Release what the runtime holds (sandboxes, processes)."""
        ...
