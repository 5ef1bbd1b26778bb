"""The README's main command: the quickstart's reward climbs on the offline default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import read_jsonl, run_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "patterns" / "custom_runtime" / "in_process_direct" / "train_local.toml"


@pytest.mark.slow
def test_quickstart_reward_climbs_and_writes_its_outputs(tmp_path: Path, model_cache_dir: Path) -> None:
    proc = run_cli(
        "run",
        CONFIG,
        "--training.max_steps",
        "6",
        "--output.output_dir",
        tmp_path,
        "--output.run_name",
        "qs",
        env={"LOOPS_NB_CACHE": str(model_cache_dir), "HF_HUB_OFFLINE": "1"},
        timeout=1800,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "qs"
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(6))
    rewards = [s["reward/mean"] for s in steps]
    assert rewards[0] < 0.2, rewards
    assert max(rewards[-3:]) >= 0.5, f"the reward did not climb: {rewards}"
    # The outputs the seed promises.
    assert json.loads((run / "run.json").read_text())["run_id"]
    rollouts = read_jsonl(run / "rollouts.jsonl")
    assert len(rollouts) == 6 * 64
    assert sorted(p.name for p in (run / "transcripts").glob("step-*.json"))[0] == "step-000000.json"
    assert "step 6/6" in proc.stdout and "reward/mean=" in proc.stdout
    # [eval]: the base model before the first step, the trained adapter after the last, apart from training.
    evals = read_jsonl(run / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 6]
    assert len(read_jsonl(run / "eval_attempts.jsonl")) == 2 * 16
    assert evals[1]["eval/reward_mean"] > evals[0]["eval/reward_mean"], evals
    assert "eval: reward_mean" in proc.stdout and "eval after 6 steps:" in proc.stdout
