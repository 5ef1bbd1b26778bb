"""The run skeleton both recipes share: a failure at the final checkpoint is a `RunFailed` naming the resume
command and the checkpoint it resumes from, in SFT as in RL (tests/rl/test_faults.py has RL's twin of this
test through the RL recipe's own run). Before the shared skeleton, SFT let the raw error escape."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import read_jsonl
from sft_fixtures import write_jsonl

from loops_nb.errors import RunFailed
from loops_nb.observers import ObserverSet
from loops_nb.run_dir import RunDirectory
from loops_nb.sft.batching import SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.train import SFTRun


class Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    async def result_async(self) -> Any:
        return self.value


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


def sft_run(tmp_path: Path, tokenizer: Any, trainer: ScriptedTrainer) -> SFTRun:
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
    return SFTRun(config, RunDirectory(tmp_path / "run"), trainer, data, ObserverSet())


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
