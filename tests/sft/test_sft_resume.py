"""Resume after SIGKILL: every optimizer step is applied exactly once, on the batch an uninterrupted run trains.

A `train_sync()` script trains the tiny model in a subprocess (save_every 2), slowed by an observer that sleeps
after each step so the test can kill it between steps; it is SIGKILLed once 5 steps are in steps.jsonl (the
last checkpoint is then at step 4, so the record of step 5 must be cut back and redone). The same run name is
run again to the end, and compared with an uninterrupted run of the same config: the same step records once
each, the same batch per step, the same losses and the same final adapter weights. The embedded Loops keeps
its state under the run directory, so the checkpoint written by the killed process loads in the next one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sft_fixtures import write_jsonl

from loops_nb import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_chat_model

PAIRS = [
    ("what is the capital of france ?", "paris is the capital of france ."),
    ("name a game .", "chess is a game ."),
    ("what game is hidden ?", "the hidden game is monopoly ."),
    ("who are you ?", "I am the assistant ."),
]
SCRIPT = """
import sys, time
from loops_nb import load
from loops_nb.observers import TerminalReporter

class SlowReporter(TerminalReporter):
    def on_step(self, record):
        super().on_step(record)
        time.sleep(float(sys.argv[3]))

load(sys.argv[1], overrides={"output.run_name": sys.argv[2]}).train_sync(observers=[SlowReporter()])
"""
KILL_AFTER = 5


def _config(folder: Path, model: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in (PAIRS[i % len(PAIRS)] for i in range(40))
    ]
    write_jsonl(folder / "train.jsonl", rows)
    (folder / "sft.toml").write_text(
        f'recipe = "sft"\n[model]\nbase_model = "{model}"\nlora_rank = 8\n'
        '[compute]\nscope = "local"\n[compute.local]\ndevice = "cpu"\n'
        '[data]\ntrain = "train.jsonl"\neval_fraction = 0.25\nshuffle_seed = 5\n'
        "[training]\nlearning_rate = 2e-2\nbatch_tokens = 96\nepochs = 2\nmax_steps = 11\n"
        "save_every = 2\neval_every = 3\n"
        f'[output]\noutput_dir = "{folder / "runs"}"\n'
    )
    return folder / "sft.toml"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _adapter_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    final = _records(run / "checkpoints.jsonl")[-1]["path"]
    match = re.match(r"bt://loops:(?P<run>[^/]+)/weights/(?P<name>[^/]+)$", final)
    assert match, final
    state = run / "state" / "local_loops" / "runs" / match["run"] / "weights" / match["name"]
    return load_file(state / "adapter" / "adapter_model.safetensors")


@pytest.mark.slow
def test_a_killed_run_resumes_with_every_step_exactly_once(tmp_path):
    model = build_tiny_chat_model(tmp_path / "model")
    config = _config(tmp_path, model)
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    killed = tmp_path / "runs" / "killed"

    proc = subprocess.Popen(
        [sys.executable, str(script), str(config), "killed", "0.5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while len(_records(killed / "steps.jsonl")) < KILL_AFTER:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(_records(killed / "steps.jsonl")) == KILL_AFTER
    last_checkpoint = _records(killed / "checkpoints.jsonl")[-1]["step"]
    assert last_checkpoint == KILL_AFTER - 1, "the killed run's last step is past its checkpoint"
    first_run_id = json.loads((killed / "run.json").read_text())["run_id"]

    resumed = subprocess.run(
        [sys.executable, str(script), str(config), "killed", "0"], env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed at step {last_checkpoint}" in resumed.stdout

    outcome = load(config, overrides={"output.run_name": "straight"}).train_sync(observers=[])
    straight = Path(outcome.run_dir)

    a, b = _records(killed / "steps.jsonl"), _records(straight / "steps.jsonl")
    assert [r["step"] for r in a] == list(range(outcome.steps)) == [r["step"] for r in b]
    assert [r["batch"] for r in a] == [r["batch"] for r in b]
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-5)
    assert [r["learning_rate"] for r in a] == [r["learning_rate"] for r in b]
    assert [r.get("eval/loss") for r in a] == pytest.approx([r.get("eval/loss") for r in b], abs=1e-5)
    evals_a, evals_b = _records(killed / "evals.jsonl"), _records(straight / "evals.jsonl")
    assert [e["step"] for e in evals_a] == [e["step"] for e in evals_b]

    wa, wb = _adapter_weights(killed), _adapter_weights(straight)
    assert wa.keys() == wb.keys() and wa
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5

    steps_saved = [c["step"] for c in _records(killed / "checkpoints.jsonl")]
    assert steps_saved == sorted(set(steps_saved)) and steps_saved[-1] == outcome.steps
    run_json = json.loads((killed / "run.json").read_text())
    assert run_json["previous_run_ids"] == [first_run_id]
