"""The README's main command: the quickstart's reward climbs on the offline default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "patterns" / "custom_runtime" / "in_process_direct" / "train_local.toml"


@pytest.mark.slow
def test_quickstart_reward_climbs_and_writes_its_outputs(tmp_path: Path, model_cache_dir: Path) -> None:
    env = {**os.environ, "LOOPS_NB_CACHE": str(model_cache_dir), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loops_nb.cli",
            "run",
            str(CONFIG),
            "--training.max_steps",
            "6",
            "--output.output_dir",
            str(tmp_path),
            "--output.run_name",
            "qs",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "qs"
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(6))
    rewards = [s["reward/mean"] for s in steps]
    assert rewards[0] < 0.2, rewards
    assert max(rewards[-3:]) >= 0.5, f"the reward did not climb: {rewards}"
    # The outputs the seed promises.
    assert json.loads((run / "run.json").read_text())["run_id"]
    rollouts = (run / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 6 * 64
    assert sorted(p.name for p in (run / "transcripts").iterdir())[0] == "step-000000.json"
    assert "step 6/6" in proc.stdout and "reward/mean=" in proc.stdout
