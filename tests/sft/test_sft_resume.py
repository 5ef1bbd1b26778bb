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
increase and are all complete (also right after each kill), and one more previous Loops run id in run.json
per killed process. The embedded Loops keeps its state under the run directory, so a checkpoint written by a
killed process loads in the next one.

The killed processes are forked from a multiprocessing fork server that has imported torch and loops_nb once,
so each starts in seconds rather than the ~20 s of a cold interpreter; each is still a separate process,
killed with a real SIGKILL.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from sft_fixtures import write_jsonl

import loops_nb.cli
from loops_nb import load
from loops_nb.observers import TerminalReporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_chat_model

PAIRS = [
    ("what is the capital of france ?", "paris is the capital of france ."),
    ("name a game .", "chess is a game ."),
    ("what game is hidden ?", "the hidden game is monopoly ."),
    ("who are you ?", "I am the assistant ."),
]
TOTAL_STEPS = 11
SEEDS = [(1, 1), (2, 1), (3, 2)]
"""(seed, kills): the seed picks each kill's moment; the last one crashes twice before the final resume."""


@dataclass
class Setup:
    folder: Path
    config: Path
    reference: Path


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


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _whole_lines(path: Path) -> int:
    """Complete records in a JSONL file a live process may be appending to."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _kill_point(rng: random.Random, left: int, kills_to_come: int) -> tuple[int, float]:
    """(n, fraction): SIGKILL `fraction` of a step after the n-th step record appears.

    n is past the `left` records the previous kill left, so the kill lands in the new process's own steps,
    and at most TOTAL_STEPS - 3 when there is room for that, so three steps are still to come and it lands before
    the run ends.
    """
    room = (TOTAL_STEPS - 3 - left) // kills_to_come
    return left + rng.randint(1, max(1, room)), 1.5 * rng.random()


PRELOAD = [
    "loops_nb.cli",
    "loops_nb.rl.recipe",
    "loops_nb.sft.recipe",
    "loops_nb.local.trainer",
    "loops_nb.local.sampler",
]
"""What the fork server imports once: a cold interpreter takes some 20 s on two cores to get there."""


def _loops_run(argv: list[str], log: str) -> None:
    """The `loops` command in this process (forked from the fork server), its output to `log`."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.exit(loops_nb.cli.main(argv))


def _start_loops_run(argv: list[str], log: Path) -> BaseProcess:
    """`loops run ...` in a process of its own, forked from a fork server that has imported the stack."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    proc = context.Process(target=_loops_run, args=(argv, str(log)))
    proc.start()
    return proc


def _kill_after(proc: BaseProcess, steps: Path, n: int, fraction: float, log: Path) -> None:
    """SIGKILL `proc` `fraction` of a step (as long as its n-th took) after `steps` has n records."""
    deadline = time.monotonic() + 300
    while _whole_lines(steps) < n:
        if proc.exitcode is not None:
            pytest.fail(f"the run ended before it could be killed:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.01)
    last = steps.read_bytes().splitlines()[n - 1]
    time.sleep(fraction * json.loads(last)["time/step_s"])
    proc.kill()
    proc.join()
    assert proc.exitcode == -signal.SIGKILL, (
        "the run finished before the kill: it should have been killed mid-way"
    )


def _tear_tails(run: Path) -> None:
    """End every log of `run` in a half record, as a kill in the middle of a long append leaves it.

    A SIGKILL stops a write() part-way only when it is long (a big step's rollouts), which these tiny runs never
    write, so the test tears the last line itself; the next process must cut it off before reading the log.
    """
    for path in run.glob("*.jsonl"):
        with path.open("a") as f:
            f.write('{"step": 99, "torn')


def _checkpoint_dir(run: Path, path: str) -> Path:
    """The folder of a recorded checkpoint; it must be complete (saved whole before it is recorded)."""
    loops_run, _, name = path.removeprefix("bt://loops:").partition("/weights/")
    folder = run / "state" / "local_loops" / "runs" / loops_run / "weights" / name
    for part in ("trainer_state.json", "optimizer.pt", "rng.pt", "adapter/adapter_model.safetensors"):
        assert (folder / part).is_file(), f"checkpoint {path} is recorded but {part} is missing"
    return folder


def _trainer_step(run: Path) -> int:
    """The optimizer steps the trainer had applied at the run's last checkpoint (its own count)."""
    folder = _checkpoint_dir(run, _records(run / "checkpoints.jsonl")[-1]["path"])
    return json.loads((folder / "trainer_state.json").read_text())["step"]


def _adapter_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    folder = _checkpoint_dir(run, _records(run / "checkpoints.jsonl")[-1]["path"])
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
    name = f"killed-{seed}"
    killed = setup.folder / "runs" / name
    argv = ["run", str(setup.config), "--output.run_name", name]
    killed_ids, rng = [], random.Random(seed)
    for i in range(kills):
        n, fraction = _kill_point(rng, _whole_lines(killed / "steps.jsonl"), kills - i)
        log = setup.folder / f"{name}-{i}.log"
        _kill_after(_start_loops_run(argv, log), killed / "steps.jsonl", n, fraction, log)
        killed_ids.append(json.loads((killed / "run.json").read_text())["run_id"])
        for c in _records(killed / "checkpoints.jsonl"):  # the kill left no half checkpoint on the record
            _checkpoint_dir(killed, c["path"])
        if i == 0 and kills > 1:
            _tear_tails(killed)

    saved = _records(killed / "checkpoints.jsonl")
    resume_at = saved[-1]["step"] if saved else 0  # killed before its first checkpoint: from step 0
    printed = io.StringIO()
    outcome = load(setup.config, overrides={"output.run_name": name}).train_sync(
        observers=[TerminalReporter(printed)]
    )
    assert outcome.status == "completed" and outcome.start_step == resume_at
    if resume_at:
        assert f"resumed at step {resume_at}" in printed.getvalue()
    straight = setup.reference

    a, b = _records(killed / "steps.jsonl"), _records(straight / "steps.jsonl")
    assert [r["step"] for r in a] == list(range(outcome.steps)) == [r["step"] for r in b]
    assert outcome.steps == TOTAL_STEPS
    assert [r["batch"] for r in a] == [r["batch"] for r in b]
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-5)
    assert [r["learning_rate"] for r in a] == [r["learning_rate"] for r in b]
    assert [r.get("eval/loss") for r in a] == pytest.approx([r.get("eval/loss") for r in b], abs=1e-5)
    evals_a, evals_b = _records(killed / "evals.jsonl"), _records(straight / "evals.jsonl")
    assert [e["step"] for e in evals_a] == [e["step"] for e in evals_b]
    assert _trainer_step(killed) == _trainer_step(straight) == TOTAL_STEPS, "optimizer steps applied"

    wa, wb = _adapter_weights(killed), _adapter_weights(straight)
    assert wa.keys() == wb.keys() and wa
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5

    for path in killed.rglob("*.jsonl"):  # no half line anywhere, and every line one record
        text = path.read_text()
        assert not text or text.endswith("\n"), f"{path} ends in a half line"
        [json.loads(line) for line in text.splitlines()]
    steps_saved = [c["step"] for c in _records(killed / "checkpoints.jsonl")]
    assert steps_saved == sorted(set(steps_saved)) and steps_saved[-1] == outcome.steps
    for c in _records(killed / "checkpoints.jsonl"):
        trainer_state = _checkpoint_dir(killed, c["path"]) / "trainer_state.json"
        assert json.loads(trainer_state.read_text())["step"] == c["step"]
    run_json = json.loads((killed / "run.json").read_text())
    assert run_json["previous_run_ids"] == killed_ids, (
        "run.json keeps the Loops run id of every killed process"
    )
