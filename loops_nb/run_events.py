"""Run events: what a run tells its observers, each step included (`StepRecord`).

One frozen dataclass per event, named for what happened and carrying the observer hook it goes to (the table of
events and hooks: docs/reference/notebook_widgets.md). ``to_json`` is the event as a file line (or a dict to
print), and ``Event.from_json(line)`` reads such a line back. Fields a run leaves out (a failed run's
`seconds`, a completed run's `error`) are None, and left out of its line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, Self, TypedDict


class RunEvent:
    """What every event shares: its hook, and its line in a file (`to_json`, `from_json`)."""

    hook: ClassVar[str]
    """The observer method the event is delivered to (``on_end``, ...)."""
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> Self:
        """The event a line read back from a file holds: each field by its key; an event with ``metrics``
        (`MetricsLine`) keeps there the keys no field names, other events drop them."""
        names = [f.name for f in fields(cls)]
        known = {k: v for k, v in line.items() if k in names}
        if "metrics" in names:
            known["metrics"] = {k: v for k, v in line.items() if k not in names}
        return cls(**known)

    def to_json(self) -> dict[str, Any]:
        """The event's line: its fields in order, ``metrics`` spread in its place, None ones left out."""
        line: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "metrics":
                line.update(value)
            elif value is not None:
                line[f.name] = value
        return line


@dataclass(frozen=True)
class MetricsLine(RunEvent):
    """A line of steps.jsonl (`StepRecord`) or evals.jsonl (`EvalRecord`): the typed fields are those every line
    has, ``metrics`` the rest, by their keys in the file, in the order they were logged."""

    step: int
    """0-based index of the step (`StepRecord`); the optimizer steps the evaluated policy had (`EvalRecord`)."""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    time: float | None = None
    """Wall-clock time (seconds since the epoch) when the line was logged."""

    def number(self, key: str) -> float | None:
        """The metric ``key`` as a finite float; None when the line has no such key, or no number there
        (a step without rewards logs `reward/mean` as None)."""
        value = self.metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return float(value)


@dataclass(frozen=True)
class StepRecord(MetricsLine):
    """One optimizer step, as a recipe's loop writes it to steps.jsonl: ``step`` (0-based; it applied steps
    ``0..step``), the recipe's ``metrics`` (RL: `reward/mean`, `discarded/<reason>`, ...; SFT: `loss`,
    `eval/loss`, ...), ``time``."""

    hook: ClassVar[str] = "on_step"

    def with_metrics(self, extra: Mapping[str, Any]) -> StepRecord:
        """This record with ``extra`` metrics after its own (e.g. the run's `memory/*`)."""
        return StepRecord(self.step, {**self.metrics, **extra}, self.time)


@dataclass(frozen=True)
class RunStarted(RunEvent):
    """The run is set up: which run, what it trains, and from where. A notebook driving a panel by hand may say
    only some of it (``RunStarted(recipe="rl", max_steps=3)``), so every field may be None."""

    hook: ClassVar[str] = "on_start"
    run_dir: str | None = None
    """The run directory (``runs/<name>``)."""
    config: str | None = None
    """The config file the run was started with (what a resume line names)."""
    recipe: str | None = None
    """``rl`` or ``sft`` (or a registered recipe's name)."""
    model: str | None = None
    """The base model."""
    scope: str | None = None
    """`[compute] scope`: where the model runs."""
    max_steps: int | None = None
    """Steps the run plans in all."""
    start_step: int | None = None
    """The step it starts at: 0, or where a resumed run picks up."""


@dataclass(frozen=True, kw_only=True)
class AttemptFinished(RunEvent):
    """RL: one attempt ended. Whether it trains is not known yet (its group's advantages come with the step):
    its transcript's calls say ``trained: None``, and the step's `StepRollouts` row says what trained. Its
    fields are given by name."""

    hook: ClassVar[str] = "on_attempt"
    attempt: str
    """The attempt's id (``s<slot>/g<group>/a<n>``-like; the `attempt` of its rollouts.jsonl row)."""
    task: str
    reward: float | None = None
    """None when the attempt was discarded."""
    discarded: str | None = None
    """Why it was discarded (``timeout``, ``agent_error``, ...), or None when it was kept."""
    detail: str
    policy_versions: list[int]
    """The policy version of each model call."""
    calls: int
    sampled_tokens: int
    sequence_breaks: dict[str, int]
    """Calls that did not extend the attempt's token sequence, by reason."""
    seconds: float
    text: Mapping[str, Any]
    """Its transcript entry, every call decoded (``text["calls"][i]["completion"]``, ...)."""


class AttemptRow(TypedDict, total=False):
    """One attempt as a row: a rollouts.jsonl or eval_attempts.jsonl line (`StepRollouts.rows`), an
    `AttemptFinished`'s line, or (in the notebook tables) the one merged into the other. Rows read back from a
    file keep keys not named here as read."""

    step: int | None  # 0-based, as in rollouts.jsonl
    slot: int
    group: int
    task: str
    attempt: str
    reward: float | None
    trained: bool | None
    passed: bool  # eval_attempts.jsonl: its reward reached `eval.pass_threshold`
    discarded: str | None
    detail: str
    policy_versions: list[int]
    calls: int
    sampled_tokens: int
    breaks: list[dict[str, Any]]  # which calls started a new token sequence, and why
    seconds: float
    text: Mapping[str, Any]  # the transcript entry: ``text["calls"][i]["completion"]``, ...


@dataclass(frozen=True)
class StepRollouts(RunEvent):
    """RL: a step trained. Its attempts' rollouts.jsonl rows, with what trained (``trained``), and the ``group``
    and ``step`` of each; `AttemptFinished` came earlier, one per attempt."""

    hook: ClassVar[str] = "on_rollouts"
    step: int
    """0-based index of the step that trained."""
    rows: list[AttemptRow] = field(default_factory=list)
    """The step's rollouts.jsonl rows."""


@dataclass(frozen=True)
class ProgressTick(RunEvent):
    """RL, every `[output] progress_every_seconds`: how far sampling has got, between step records."""

    hook: ClassVar[str] = "on_progress"
    attempts_done: int
    """Attempts finished so far in this process."""
    in_flight: int
    """Attempts running now."""
    policy_version: int
    """The policy version the sampler serves."""


@dataclass(frozen=True)
class EvalRecord(MetricsLine):
    """An evaluation, as evals.jsonl holds it: RL's policy after ``step`` steps on the eval tasks (`[eval]`:
    ``eval/reward_mean``, ``eval/pass_at_<k>``, ``eval/tasks``, ...), or SFT's held-out loss before training
    (``step`` 0, ``eval/loss``; later ones arrive in the step records)."""

    hook: ClassVar[str] = "on_eval"


@dataclass(frozen=True)
class RunEnded(RunEvent):
    """The run ended, however it ended. ``completed`` and ``stopped`` say how long it took; ``failed`` says why:
    a fault (``error``, and ``resume_step``, the checkpoint to resume from) or, with ``reason``, a run that ran
    its steps and trained none of them."""

    hook: ClassVar[str] = "on_end"
    status: str
    """``completed``, ``stopped`` or ``failed``."""
    steps: int | None = None
    """Optimizer steps applied when it ended."""
    seconds: float | None = None
    """How long this process ran it (0 for a run found finished); None for a fault."""
    reason: str | None = None
    """Why a run that ran to its end is ``failed`` (e.g. every attempt was discarded); None otherwise."""
    error: str | None = None
    """What stopped a ``failed`` run (the fault, or the reason)."""
    resume_step: int | None = None
    """After a fault: the step its last checkpoint resumes from."""
