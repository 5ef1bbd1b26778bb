"""Resume after SIGKILL: every optimizer step is applied exactly once, on the batch an uninterrupted run trains.

One uninterrupted reference run of the config (the tiny model, 11 steps, save_every 2, eval_every 3) is trained
in-process, once for the module. Then, for each of three seeds, `loops run` trains the same config in a process
of its own that is SIGKILLed at a random moment picked by the seed: a random fraction of a step after its n-th
step record appears (n random too), so the kill lands anywhere in what follows: forward_backward, optim_step,
an evaluation, a checkpoint save or a JSONL append; sometimes before the first checkpoint, so the run starts
over. One seed kills the resumed run a second time before it finishes (a double crash), and before that resume
leaves a half record at the end of every log, as a kill inside a long append would. The run is then resumed
in-process to the end and compared with the reference: the same step records once each, the same batch per
step, the same losses and learning rates, the same evaluations, the same optimizer-step count (the trainer's
own, in the final checkpoint) and the same final adapter weights; whole JSONL lines only, checkpoints that
increase and are all complete (also right after each kill), and one more Loops run id in run.json's run_ids
per killed process. The embedded Loops keeps its state under the run directory, so a checkpoint written by a
killed process loads in the next one. The kills are `tests/crash_harness.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crash_harness import (
    SEEDS,
    Setup,
    assert_whole_logs,
    checkpoint_dir,
    crash,
    resume_to_end,
    trainer_step,
)
from helpers import read_jsonl
from sft_fixtures import write_jsonl
from tiny_models import build_tiny_chat_model

from loops_nb import load

PAIRS = [
    ("what is the capital of france ?", "paris is the capital of france ."),
    ("name a game .", "chess is a game ."),
    ("what game is hidden ?", "the hidden game is monopoly ."),
    ("who are you ?", "I am the assistant ."),
]
TOTAL_STEPS = 11


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
        f"[training]\nlearning_rate = 2e-2\nbatch_tokens = 96\nepochs = 2\nmax_steps = {TOTAL_STEPS}\n"
        "save_every = 2\neval_every = 3\n"
        f'[output]\noutput_dir = "{folder / "runs"}"\n'
    )
    return folder / "sft.toml"


def _adapter_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    folder = checkpoint_dir(run, read_jsonl(run / "checkpoints.jsonl")[-1]["path"])
    return load_file(folder / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    folder = tmp_path_factory.mktemp("sft-resume")
    config = _config(folder, build_tiny_chat_model(folder / "model"))
    outcome = load(config, overrides={"output.run_name": "reference"}).train_sync(observers=[])
    assert outcome.status == "completed" and outcome.steps == TOTAL_STEPS
    return Setup(folder, config, Path(outcome.run_dir))


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "kills"), SEEDS, ids=[f"seed{s}-{k}kill" for s, k in SEEDS])
def test_a_killed_run_resumes_with_every_step_exactly_once(setup: Setup, seed: int, kills: int) -> None:
    killed = setup.folder / "runs" / f"killed-{seed}"
    killed_ids = crash(setup.config, killed, setup.folder, seed, kills, TOTAL_STEPS)

    outcome = resume_to_end(setup.config, killed)
    straight = setup.reference

    a, b = read_jsonl(killed / "steps.jsonl"), read_jsonl(straight / "steps.jsonl")
    assert [r["step"] for r in a] == list(range(outcome.steps)) == [r["step"] for r in b]
    assert outcome.steps == TOTAL_STEPS
    assert [r["batch"] for r in a] == [r["batch"] for r in b]
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-5)
    assert [r["learning_rate"] for r in a] == [r["learning_rate"] for r in b]
    assert [r.get("eval/loss") for r in a] == pytest.approx([r.get("eval/loss") for r in b], abs=1e-5)
    evals_a, evals_b = read_jsonl(killed / "evals.jsonl"), read_jsonl(straight / "evals.jsonl")
    assert [e["step"] for e in evals_a] == [e["step"] for e in evals_b]
    last_a, last_b = (
        read_jsonl(killed / "checkpoints.jsonl")[-1],
        read_jsonl(straight / "checkpoints.jsonl")[-1],
    )
    assert trainer_step(killed, last_a["path"]) == trainer_step(straight, last_b["path"]) == TOTAL_STEPS

    wa, wb = _adapter_weights(killed), _adapter_weights(straight)
    assert wa.keys() == wb.keys() and wa
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5

    assert_whole_logs(killed)
    assert read_jsonl(killed / "checkpoints.jsonl")[-1]["step"] == outcome.steps
    run_json = json.loads((killed / "run.json").read_text())
    assert run_json["run_ids"][:-1] == killed_ids, "run.json keeps the Loops run id of every killed process"
    assert run_json["run_id"] == killed_ids[0], "run_id names the first Loops run, never a later one"
