"""The Harbor local-program pattern: a separate program per trial, over the run's OpenAI gateway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import read_jsonl

import loops_nb

pytestmark = pytest.mark.bwrap

REPO = Path(__file__).resolve().parents[2]
PATTERN = REPO / "patterns" / "harbor" / "local_openai" / "train_local.toml"


@pytest.mark.slow
async def test_the_program_samples_through_the_gateway_and_its_answer_reaches_the_verifier(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    project = loops_nb.load(
        PATTERN,
        overrides={
            "model.base_model": str(tiny_chat_model_path),
            "model.lora_rank": 4,
            "training.max_steps": 1,
            "training.group_size": 2,
            "training.groups_per_step": 1,
            "sampling.max_tokens": 4,
            "output.output_dir": str(tmp_path / "runs"),
            "output.run_name": "program",
        },
    )
    outcome = await project.train()
    run = Path(outcome.run_dir)
    records = read_jsonl(run / "rollouts.jsonl")
    assert len(records) == 2
    assert all(r["discarded"] is None for r in records), [r["detail"] for r in records]
    assert all(r["sampled_tokens"] > 0 for r in records)
    transcript = json.loads(next((run / "transcripts").iterdir()).read_text())
    text = json.dumps(transcript)
    assert "most famous board game" in text, "the program got the task's instruction on stdin"
    assert "answer:" in text, "the verifier read the file the program's output was written to"
