"""Typed run events: each writes its line (``to_json``: the keys in order, None left out), reads back from it
(``from_json``), and reaches the observer hook it names."""

from __future__ import annotations

import io
from typing import Any

import pytest

from loops_nb.observers import ObserverSet, TerminalReporter
from loops_nb.run_events import (
    AttemptFinished,
    EvalRecord,
    ProgressTick,
    RunEnded,
    RunEvent,
    RunStarted,
    StepRecord,
    StepRollouts,
)

ATTEMPT = AttemptFinished(
    attempt="s0/g1/a2",
    task="q7",
    reward=None,
    discarded="timeout",
    detail="no reply in 30 s",
    policy_versions=[3, 3],
    calls=2,
    sampled_tokens=40,
    sequence_breaks={},
    seconds=30.5,
    text={"attempt": "s0/g1/a2", "calls": [{"completion": "hi", "trained": None}]},
)

# Each event beside its line: what `to_json` writes and `from_json` reads back.
AS_LINES: list[tuple[RunEvent, dict[str, Any]]] = [
    (
        RunStarted("runs/x", "rl.toml", "rl", "tiny", "local", 8, 0),
        {
            "run_dir": "runs/x",
            "config": "rl.toml",
            "recipe": "rl",
            "model": "tiny",
            "scope": "local",
            "max_steps": 8,
            "start_step": 0,
        },
    ),
    (
        ATTEMPT,
        {
            "attempt": "s0/g1/a2",
            "task": "q7",
            "discarded": "timeout",
            "detail": "no reply in 30 s",
            "policy_versions": [3, 3],
            "calls": 2,
            "sampled_tokens": 40,
            "sequence_breaks": {},
            "seconds": 30.5,
            "text": {"attempt": "s0/g1/a2", "calls": [{"completion": "hi", "trained": None}]},
        },
    ),
    (
        StepRollouts(2, [{"step": 2, "attempt": "a", "trained": True}]),
        {"step": 2, "rows": [{"step": 2, "attempt": "a", "trained": True}]},
    ),
    (ProgressTick(12, 4, 3), {"attempts_done": 12, "in_flight": 4, "policy_version": 3}),
    (
        EvalRecord(4, {"eval/reward_mean": 0.5, "eval/tasks": 3}, 1.5),
        {"step": 4, "eval/reward_mean": 0.5, "eval/tasks": 3, "time": 1.5},
    ),
    (
        EvalRecord(0, {"eval/loss": 2.5, "eval/examples": 4}),
        {"step": 0, "eval/loss": 2.5, "eval/examples": 4},
    ),
    (RunEnded("completed", 8, 12.0), {"status": "completed", "steps": 8, "seconds": 12.0}),
    (
        RunEnded("failed", 8, 12.0, reason="no step trained", error="no step trained"),
        {
            "status": "failed",
            "steps": 8,
            "seconds": 12.0,
            "reason": "no step trained",
            "error": "no step trained",
        },
    ),
    (
        RunEnded("failed", 2, error="RuntimeError: CUDA error", resume_step=2),
        {"status": "failed", "steps": 2, "error": "RuntimeError: CUDA error", "resume_step": 2},
    ),
]


@pytest.mark.parametrize(("event", "line"), AS_LINES, ids=lambda x: type(x).__name__)
def test_an_event_is_its_line_and_reads_back_from_it(event: RunEvent, line: dict[str, Any]) -> None:
    assert list(event.to_json().items()) == list(line.items()), "the same keys in the same order"
    assert type(event).from_json(line) == event and type(event).from_json(line).to_json() == line


def test_a_line_that_says_less_reads_as_none_and_writes_back_as_it_was() -> None:
    started = RunStarted.from_json({"recipe": "rl", "max_steps": 2})
    assert started == RunStarted(recipe="rl", max_steps=2) and started.run_dir is None
    assert started.to_json() == {"recipe": "rl", "max_steps": 2}
    ended = RunEnded.from_json({"status": "completed", "steps": 3, "note": "a key no event has"})
    assert ended == RunEnded("completed", 3) and ended.to_json() == {"status": "completed", "steps": 3}


def test_keys_no_field_names_are_a_lines_metrics() -> None:
    line = {"step": 2, "eval/loss": 1.5, "time": 3.0, "eval/examples": 4}
    evaluation = EvalRecord.from_json(line)
    assert evaluation == EvalRecord(2, {"eval/loss": 1.5, "eval/examples": 4}, 3.0)
    assert evaluation.number("eval/loss") == 1.5 and evaluation.number("missing") is None
    assert StepRecord.from_json(line).metrics == evaluation.metrics, "steps.jsonl and evals.jsonl: one shape"


class FieldObserver:
    """An observer of every hook, reading the fields of what it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def on_start(self, started: RunStarted) -> None:
        self.seen.append(("start", started.run_dir))

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self.seen.append(("attempt", (attempt.reward, attempt.text["calls"])))

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        self.seen.append(("rollouts", [dict(r, at=rollouts.step) for r in rollouts.rows]))

    def on_progress(self, tick: ProgressTick) -> None:
        self.seen.append(("progress", (tick.attempts_done, tick.in_flight, tick.policy_version)))

    def on_eval(self, evaluation: EvalRecord) -> None:
        self.seen.append(("eval", dict(evaluation.metrics)))

    def on_end(self, ended: RunEnded) -> None:
        self.seen.append(("end", (ended.status, ended.reason)))


def test_each_hook_gets_its_event() -> None:
    watcher = FieldObserver()
    observers = ObserverSet([watcher])
    for event, _ in AS_LINES:
        observers.emit(event)
    assert observers.observers == [watcher], "no hook raised"
    assert watcher.seen[0] == ("start", "runs/x")
    assert watcher.seen[1] == ("attempt", (None, [{"completion": "hi", "trained": None}]))
    assert watcher.seen[2] == ("rollouts", [{"step": 2, "attempt": "a", "trained": True, "at": 2}])
    assert watcher.seen[3] == ("progress", (12, 4, 3))
    assert watcher.seen[4] == ("eval", {"eval/reward_mean": 0.5, "eval/tasks": 3})
    assert [s for s in watcher.seen if s[0] == "end"] == [
        ("end", ("completed", None)),
        ("end", ("failed", "no step trained")),
        ("end", ("failed", None)),
    ]


def test_each_event_goes_to_its_hook_and_wants_asks_for_it() -> None:
    class StepsOnly:
        def __init__(self) -> None:
            self.steps: list[StepRecord] = []

        def on_step(self, record: StepRecord) -> None:
            self.steps.append(record)

    watcher = StepsOnly()
    observers = ObserverSet([watcher])
    assert observers.wants(StepRecord) and not observers.wants(AttemptFinished)
    observers.emit(StepRecord(0, {"loss": 1.0}))
    observers.emit(RunEnded("completed", 1, 0.0))  # nobody has on_end: nothing happens
    assert [r.step for r in watcher.steps] == [0]


def test_terminal_reporter_says_why_a_run_that_trained_nothing_failed() -> None:
    out = io.StringIO()
    reporter = TerminalReporter(out)
    observers = ObserverSet([reporter])
    observers.emit(RunStarted("runs/x", "rl.toml", "rl", "tiny", "local", 2, 0))
    observers.emit(EvalRecord(0, {"eval/reward_mean": 0.0625, "eval/tasks": 4}, 1.0))
    observers.emit(ProgressTick(8, 0, 0))
    reason = "no step trained: all 8 attempts were discarded (8 timeout)"
    observers.emit(RunEnded("failed", 2, 31.4, reason=reason, error=reason))
    reporter.on_end(RunEnded("completed", steps=2, seconds=3.0))
    assert out.getvalue().splitlines() == [
        "run runs/x: rl on tiny (local)",
        "eval after 0 steps: reward_mean=0.0625  tasks=4",
        "  … attempts_done=8, in_flight=0, policy_version=0",
        f"done: failed after 2 steps in 31s; reason: {reason}",
        "done: completed after 2 steps in 3s",
    ]
