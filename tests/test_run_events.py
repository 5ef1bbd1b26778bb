"""Typed run events: each is the dict observers were given before (same keys, same order), reads back from that
dict through ``.of``, and reaches an observer written against dicts unchanged."""

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
    StepRollouts,
)
from loops_nb.step_record import StepRecord

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

# Each event beside the dict its hook was given before the events were typed (by the same producer).
AS_DICTS: list[tuple[RunEvent, dict[str, Any]]] = [
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
            "reward": None,  # None-valued keys stay: the dict always had every key
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


@pytest.mark.parametrize(("event", "line"), AS_DICTS, ids=lambda x: type(x).__name__)
def test_an_event_and_its_dict_read_the_same(event: RunEvent, line: dict[str, Any]) -> None:
    assert list(event.items()) == list(line.items()), "the same keys in the same order"
    assert event == line and dict(event) == line and event.to_json() == line
    assert type(event).of(line) == event and type(event).of(line).to_json() == line
    assert type(event).of(event) is event
    assert {k: event[k] for k in line} == line and len(event) == len(line)


def test_a_dict_that_says_less_reads_as_none_and_stays_as_it_was() -> None:
    started = RunStarted.of({"recipe": "rl", "max_steps": 2})
    assert started.recipe == "rl" and started.max_steps == 2 and started.run_dir is None
    assert dict(started) == {"recipe": "rl", "max_steps": 2}
    ended = RunEnded.of({"status": "completed", "steps": 3, "note": "a key no event has"})
    assert (
        ended.seconds is None and ended.reason is None and dict(ended) == {"status": "completed", "steps": 3}
    )


class DictObserver:
    """An observer written before the events were typed: it indexes, copies and unpacks what it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def on_start(self, info: dict[str, Any]) -> None:
        self.seen.append(("start", {**info}))

    def on_attempt(self, record: dict[str, Any]) -> None:
        self.seen.append(("attempt", {"reward": record["reward"], "calls": record["text"]["calls"]}))

    def on_rollouts(self, payload: dict[str, Any]) -> None:
        self.seen.append(("rollouts", {"rows": [dict(r, at=payload["step"]) for r in payload["rows"]]}))

    def on_progress(self, snapshot: dict[str, Any]) -> None:
        self.seen.append(("progress", dict(snapshot)))

    def on_eval(self, line: dict[str, Any]) -> None:
        self.seen.append(("eval", {k: v for k, v in line.items() if k.startswith("eval/")}))

    def on_end(self, summary: dict[str, Any]) -> None:
        self.seen.append(("end", {"status": summary.get("status"), "why": summary.get("reason")}))


def test_an_observer_written_against_dicts_still_receives_what_it_used_to() -> None:
    old = DictObserver()
    observers = ObserverSet([old])
    for event, _ in AS_DICTS:
        observers.emit(event)
    assert observers.observers == [old], "no hook raised"
    assert old.seen[0] == ("start", AS_DICTS[0][1])
    assert old.seen[1] == ("attempt", {"reward": None, "calls": [{"completion": "hi", "trained": None}]})
    assert old.seen[2] == ("rollouts", {"rows": [{"step": 2, "attempt": "a", "trained": True, "at": 2}]})
    assert old.seen[3] == ("progress", {"attempts_done": 12, "in_flight": 4, "policy_version": 3})
    assert old.seen[4] == ("eval", {"eval/reward_mean": 0.5, "eval/tasks": 3})
    assert [s for s in old.seen if s[0] == "end"] == [
        ("end", {"status": "completed", "why": None}),
        ("end", {"status": "failed", "why": "no step trained"}),
        ("end", {"status": "failed", "why": None}),
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
    reporter.on_end({"status": "completed", "steps": 2, "seconds": 3.0})  # a dict reads as it did
    assert out.getvalue().splitlines() == [
        "run runs/x: rl on tiny (local)",
        "eval after 0 steps: reward_mean=0.0625  tasks=4",
        "  … attempts_done=8, in_flight=0, policy_version=0",
        f"done: failed after 2 steps in 31s; reason: {reason}",
        "done: completed after 2 steps in 3s",
    ]
