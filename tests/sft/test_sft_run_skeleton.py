"""SFT on the run skeleton both recipes share, with a scripted training client.

A failure at the final checkpoint is a `RunFailed` naming the resume command and the checkpoint it resumes
from, in SFT as in RL (tests/rl/test_faults.py has RL's twin through the RL recipe's own run); before the
shared skeleton, SFT let the raw error escape. Observers get each step as the `StepRecord` whose line
steps.jsonl holds."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import Done, read_jsonl
from sft_fixtures import write_jsonl

from loops_nb.errors import RunFailed, UserError
from loops_nb.observers import ObserverSet
from loops_nb.run_dir import RunDirectory
from loops_nb.run_events import RunEnded, StepRecord
from loops_nb.sft.batching import SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.loop import SFTRun, check_plan
from loops_nb.sft.outcome import SFTOutcome


class ScriptedTrainer:
    """A training client whose `disk_full_at_save`-th trainer-state save fails as a full disk does."""

    def __init__(self, disk_full_at_save: int) -> None:
        self.saves = 0
        self.disk_full_at_save = disk_full_at_save

    async def forward_backward_async(self, datums: list[Any], loss_fn: str) -> Done:
        outputs = [{"logprobs": [-1.0] * len(d.loss_fn_inputs["target_tokens"].data)} for d in datums]
        return Done(SimpleNamespace(loss_fn_outputs=outputs, loss=1.0))

    async def optim_step_async(self, params: Any) -> Done:
        return Done(SimpleNamespace(metrics={"grad_norm": 0.5}))

    async def save_state_async(self, name: str) -> Done:
        self.saves += 1
        if self.saves == self.disk_full_at_save:
            raise OSError(errno.ENOSPC, "No space left on device")
        return Done(SimpleNamespace(path=f"loops://scripted/{name}"))

    async def save_weights_for_sampler_async(self, name: str) -> Done:
        return Done(SimpleNamespace(path=f"loops://scripted/sampler/{name}"))


def sft_run(
    tmp_path: Path, tokenizer: Any, trainer: ScriptedTrainer, observers: ObserverSet | None = None
) -> SFTRun:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": f"answer {i}"},
            ]
        }
        for i in range(6)
    ]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    config = SFTConfig.model_validate(
        {
            "data": {"train": str(train), "eval_fraction": 0.0},
            "training": {"batch_tokens": 64, "max_steps": 3, "save_every": 2},
        }
    )
    data = SFTData.load(config, tokenizer)
    return SFTRun(config, RunDirectory(tmp_path / "run"), trainer, data, observers or ObserverSet())


async def test_sft_a_failed_final_checkpoint_is_a_run_failure_with_the_resume_command(
    tmp_path: Path, smollm2: Any
) -> None:
    trainer = ScriptedTrainer(disk_full_at_save=2)  # the periodic save at step 2 works, the final one fails
    run = sft_run(tmp_path, smollm2, trainer)
    assert run.total_steps == 3
    with pytest.raises(RunFailed) as info:
        await run.execute(await run.resume_point())
    failure = info.value
    assert "No space left on device" in str(failure)
    assert failure.resume_step == 2, "the periodic checkpoint is the one to resume from"
    assert "--output.run_name run to resume from step 2" in str(failure)
    assert [c["step"] for c in read_jsonl(tmp_path / "run" / "checkpoints.jsonl")] == [2]
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "steps.jsonl")] == [0, 1, 2]
    assert "failed:" in (tmp_path / "run" / "run.log").read_text()


class Recorder:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.ends: list[RunEnded] = []

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def on_end(self, ended: RunEnded) -> None:
        self.ends.append(ended)


async def test_sft_observers_get_each_step_as_the_record_steps_jsonl_holds(
    tmp_path: Path, smollm2: Any
) -> None:
    recorder = Recorder()
    run = sft_run(tmp_path, smollm2, ScriptedTrainer(disk_full_at_save=0), ObserverSet([recorder]))
    outcome = await run.execute(await run.resume_point())
    assert isinstance(outcome, SFTOutcome) and outcome.status == "completed" and outcome.steps == 3
    lines = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert all(isinstance(r, StepRecord) for r in recorder.steps)
    assert [r.to_json() for r in recorder.steps] == lines
    assert [r.step for r in recorder.steps] == [0, 1, 2] and all(
        r.number("loss") == 1.0 for r in recorder.steps
    )
    assert outcome.last_metrics == lines[-1]
    assert recorder.ends == [RunEnded("completed", 3, outcome.seconds)]
    assert [c["step"] for c in read_jsonl(tmp_path / "run" / "checkpoints.jsonl")] == [2, 3]


def test_a_step_record_is_its_steps_jsonl_line() -> None:
    line = {"step": 4, "reward/mean": 0.5, "reward/std": None, "trained": True, "note": "x", "time": 17.0}
    record = StepRecord.from_json(line)
    assert record.step == 4 and record.time == 17.0 and record.to_json() == line
    assert list(record.to_json()) == list(line), "the same keys in the same order"
    assert record.metrics["note"] == "x" and "missing" not in record.metrics and "step" not in record.metrics
    assert record.number("reward/mean") == 0.5
    assert [record.number(k) for k in ("reward/std", "trained", "note", "missing")] == [None] * 4


def test_steps_that_trained_other_batches_than_the_plan_gives_are_refused(tmp_path: Path) -> None:
    """On a resume (the steps before its checkpoint) and on a finished run's rerun (all of them) alike."""
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.steps.extend([{"step": 0, "batch": "a"}, {"step": 1, "batch": "b"}])
    plan = SimpleNamespace(batch_id=lambda step: "a" if step == 0 else "c")
    check_plan(run_dir, plan, up_to=1)  # type: ignore[arg-type]  # step 1 is redone from the plan
    with pytest.raises(UserError, match="step 1 trained batch b, but the data and config now plan batch c"):
        check_plan(run_dir, plan)  # type: ignore[arg-type]
