"""A killed RL run resumes at its last checkpoint and applies every optimizer step exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_chat_model

EPISODE = """
from loops_nb.episodes import Episode, Task
from loops_nb.llm.client import llm


class Lengthy(Episode):
    def tasks(self):
        return [Task(str(i), {}) for i in range(5)]

    async def run(self, task):
        reply = await llm().chat([{"role": "user", "content": "Talk."}], max_tokens=8)
        return float(len(reply.text) % 4)
"""

CONFIG = """
recipe = "rl"
[model]
base_model = "{model}"
lora_rank = 4
[compute.local]
device = "cpu"
[runtime]
factory = "lengthy:Lengthy"
[training]
max_steps = 6
group_size = 4
groups_per_step = 2
learning_rate = 1e-3
save_every = 1
[output]
output_dir = "{out}"
run_name = "resumable"
"""


def steps_of(run: Path) -> list[dict]:
    path = run / "steps.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_killed_run_resumes_exactly_once(tmp_path: Path) -> None:
    model = build_tiny_chat_model(tmp_path / "model")
    (tmp_path / "lengthy.py").write_text(EPISODE)
    config = tmp_path / "train.toml"
    config.write_text(CONFIG.format(model=model, out=tmp_path / "runs"))
    run = tmp_path / "runs" / "resumable"
    cmd = [sys.executable, "-m", "loops_nb.cli", "run", str(config)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(steps_of(run)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(steps_of(run))
    assert 3 <= killed_at < 6, "the run should have been killed mid-way"

    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed at step" in done.stdout
    steps = steps_of(run)
    assert [s["step"] for s in steps] == list(range(6)), "every step exactly once, in order"
    trained = [s for s in steps if s["trained"]]
    # The policy version counts optimizer steps: it rises by one per trained step, never repeats.
    assert [s["policy_version"] for s in trained] == sorted({s["policy_version"] for s in trained})
    checkpoints = [json.loads(x) for x in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints] == sorted({c["step"] for c in checkpoints})
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rollouts}) == list(range(6))
    assert len(rollouts) == 6 * 8
    meta = json.loads((run / "run.json").read_text())
    assert meta["previous_run_ids"], "run.json keeps the Loops run ids of earlier attempts"
