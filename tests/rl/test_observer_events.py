"""What an RL run tells its observers: what trained is what trained (the live events agree with rollouts.jsonl),
and a run that fails still ends (``on_end`` with status ``failed`` and the step to resume from).

An attempt finishes before its step's advantages exist, so ``on_attempt`` cannot know whether it will train
(a group whose rewards are all equal trains nothing); its transcript says ``trained: None``, and the step's
``on_rollouts`` event carries the rows rollouts.jsonl gets, with the real ``trained`` of each attempt. The
live panel once showed "trained" in green for attempts of a step that trained no token.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from helpers import read_jsonl
from test_faults import MONOPOLY, ScriptedSampler, ScriptedTrainer, make_run

from loops_nb.errors import RunFailed
from loops_nb.run_events import AttemptFinished, RunEnded, StepRollouts


class AlwaysRight(ScriptedSampler):
    """Every answer is right: every group's rewards are equal, so no attempt has an advantage."""

    async def sample_async(self, model_input: Any, num_samples: int, sampling_params: Any) -> Any:
        self.calls += 1
        seq = SimpleNamespace(tokens=MONOPOLY, logprobs=[-1.0] * len(MONOPOLY), stop_reason="stop")
        return SimpleNamespace(sequences=[seq] * num_samples, policy_version=None)


class Events:
    def __init__(self) -> None:
        self.attempts: list[AttemptFinished] = []
        self.rollouts: list[dict[str, Any]] = []
        self.ends: list[RunEnded] = []

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self.attempts.append(attempt)

    def on_end(self, ended: RunEnded) -> None:
        self.ends.append(ended)

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        self.rollouts.extend(dict(r, event_step=rollouts.step) for r in rollouts.rows)


async def run_with(tmp_path: Path, sampler: ScriptedSampler) -> tuple[Events, list[dict[str, Any]]]:
    events = Events()
    run = make_run(tmp_path, ScriptedTrainer(sampler), observers=[events], max_steps=2)
    outcome = await run.execute(0)
    assert outcome.status == "completed"
    return events, read_jsonl(tmp_path / "run" / "rollouts.jsonl")


async def test_a_step_whose_rewards_are_all_equal_says_nothing_trained(tmp_path: Path) -> None:
    events, rows = await run_with(tmp_path, AlwaysRight())
    assert rows and not any(r["trained"] for r in rows)
    assert [(r["attempt"], r["step"], r["trained"]) for r in events.rollouts] == [
        (r["attempt"], r["step"], r["trained"]) for r in rows
    ]
    assert all(r["event_step"] == r["step"] for r in events.rollouts)
    calls = [c for a in events.attempts for c in a.text["calls"]]
    assert calls and all(c["trained"] is None for c in calls), "unknown when the attempt finishes"


async def test_trained_attempts_are_the_ones_rollouts_jsonl_marks(tmp_path: Path) -> None:
    events, rows = await run_with(tmp_path, ScriptedSampler())  # right, wrong, right, ...: groups train
    assert any(r["trained"] for r in rows)
    assert {r["attempt"]: r["trained"] for r in events.rollouts} == {r["attempt"]: r["trained"] for r in rows}
    assert {r["group"] for r in events.rollouts} == {r["group"] for r in rows}


async def test_a_failed_run_ends_for_its_observers_with_the_step_to_resume_from(tmp_path: Path) -> None:
    import pytest

    events = Events()
    run = make_run(
        tmp_path, ScriptedTrainer(ScriptedSampler(), fail_forward_at=3), observers=[events], max_steps=4
    )
    with pytest.raises(RunFailed):
        await run.execute(0)
    [end] = events.ends
    assert end.status == "failed" and end.steps == 2 and end.resume_step == 2
    assert end.error is not None and "CUDA error" in end.error
    # Its line, as an observer that writes it out gets it:
    assert end.to_json() == {"status": "failed", "steps": 2, "error": end.error, "resume_step": 2}
