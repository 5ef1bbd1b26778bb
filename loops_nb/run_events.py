"""Run events: what a run tells its observers besides each step (that one is a `StepRecord`).

One frozen dataclass per event, each named for what happened and carrying the observer hook it goes to:

| event             | hook          | when                                                              |
|-------------------|---------------|-------------------------------------------------------------------|
| `RunStarted`      | `on_start`    | the run knows its directory and the step it starts at             |
| `AttemptFinished` | `on_attempt`  | RL: an attempt ended (before anyone knows whether it trains)      |
| `StepRollouts`    | `on_rollouts` | RL: a step trained; its rollouts.jsonl rows, `trained` filled in  |
| `ProgressTick`    | `on_progress` | RL: every `[output] progress_every_seconds` while the run goes on |
| `EvalRecord`      | `on_eval`     | an evaluation's evals.jsonl line (SFT: the loss before training)  |
| `RunEnded`        | `on_end`      | the run ended: completed, stopped or failed                       |

Each event is also a read-only mapping of the dict observers were given before the events were typed (the
same keys in the same order), so an observer written as ``summary["status"]`` or ``dict(payload)`` keeps
working, and an event equals the dict it reads as. ``Event.of(mapping)`` reads such a dict (an event is
returned as it is): ``Event.of(d) == d`` for any dict a run ever sent. Fields a run leaves out (a failed run's
`seconds`, a completed run's `error`) are None and left out of the mapping.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, Self

_EVAL_TYPED = ("step", "time")


class RunEvent(Mapping[str, Any]):
    """What every event shares: its hook, its dict (`to_json`), and the mapping and `of` built on that dict."""

    hook: ClassVar[str]
    """The observer method the event is delivered to (``on_end``, ...)."""
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> Self:
        """The event a dict (an observer's old payload, a line read back from a file) reads as."""
        if isinstance(line, cls):
            return line
        return cls(**{f.name: line[f.name] for f in fields(cls) if f.name in line})

    def to_json(self) -> dict[str, Any]:
        """The event's dict: its fields in order, those that are None left out."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True, eq=False)
class RunStarted(RunEvent):
    """The run is set up: which run, what it trains, and from where. A hand-written dict may say only some of
    it (a notebook driving a panel by hand), so every field may be None."""

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


@dataclass(frozen=True, eq=False)
class AttemptFinished(RunEvent):
    """RL: one attempt ended. Whether it trains is not known yet (its group's advantages come with the step):
    its transcript's calls say ``trained: None``, and the step's `StepRollouts` row says what trained."""

    hook: ClassVar[str] = "on_attempt"
    attempt: str
    """The attempt's id (``s<slot>/g<group>/a<n>``-like; the `attempt` of its rollouts.jsonl row)."""
    task: str
    reward: float | None
    """None when the attempt was discarded."""
    discarded: str | None
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

    def to_json(self) -> dict[str, Any]:
        """Every key, None ones included, as the dict always had them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, eq=False)
class StepRollouts(RunEvent):
    """RL: a step trained. Its attempts' rollouts.jsonl rows, with what trained (``trained``), and the ``group``
    and ``step`` of each; `AttemptFinished` came earlier, one per attempt."""

    hook: ClassVar[str] = "on_rollouts"
    step: int
    """0-based index of the step that trained."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The step's rollouts.jsonl rows (step, slot, group, task, attempt, reward, trained, discarded, ...)."""


@dataclass(frozen=True, eq=False)
class ProgressTick(RunEvent):
    """RL, every `[output] progress_every_seconds`: how far sampling has got, between step records."""

    hook: ClassVar[str] = "on_progress"
    attempts_done: int
    """Attempts finished so far in this process."""
    in_flight: int
    """Attempts running now."""
    policy_version: int
    """The policy version the sampler serves."""


@dataclass(frozen=True, eq=False)
class EvalRecord(RunEvent):
    """An evaluation, as evals.jsonl holds it: RL's policy after ``step`` steps on the eval tasks (`[eval]`:
    ``eval/reward_mean``, ``eval/pass_at_<k>``, ``eval/tasks``, ...), or SFT's held-out loss before training
    (``step`` 0, ``eval/loss``; later ones arrive in the step records). As in `StepRecord`, the typed fields
    are those every line has, and ``metrics`` the rest, by their evals.jsonl keys."""

    hook: ClassVar[str] = "on_eval"
    step: int
    """Optimizer steps the evaluated policy had (0: before training)."""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    time: float | None = None
    """Wall-clock time (seconds since the epoch) when the evaluation was recorded."""

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> Self:
        if isinstance(line, cls):
            return line
        time = line.get("time")
        metrics = {k: v for k, v in line.items() if k not in _EVAL_TYPED}
        return cls(int(line["step"]), metrics, float(time) if isinstance(time, int | float) else None)

    def to_json(self) -> dict[str, Any]:
        """The evals.jsonl line: the step first, the metrics as recorded, the time last."""
        line: dict[str, Any] = {"step": self.step, **self.metrics}
        if self.time is not None:
            line["time"] = self.time
        return line


@dataclass(frozen=True, eq=False)
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
