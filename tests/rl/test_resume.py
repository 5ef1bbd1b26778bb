"""A killed RL run resumes at its last checkpoint and applies every optimizer step exactly once.

One uninterrupted reference run of the config (the tiny model, 8 steps, save_every 1) is trained in-process,
once for the module. Then, for each of three seeds, `loops run` trains the same config in a process of its
own that is SIGKILLed at a random moment picked by the seed: a random fraction of a step after its n-th step
record appears (n random too), so the kill lands anywhere in what follows: sampling, forward_backward,
publishing, a checkpoint save or a JSONL append; sometimes before the first checkpoint, so the run starts
over. One seed kills the resumed run a second time before it finishes (a double crash), and before that
resume leaves a half record at the end of every log, as a kill inside a long append would. The run is then
resumed in-process to the end and compared with the reference: every step recorded once and in order, the
same optimizer-step count (the policy version of every step, and the trainer's own step count in the final
checkpoint), the same tasks in every step, whole JSONL lines only, checkpoints that increase and are all
complete (also right after each kill), and one more previous Loops run id in run.json per killed process.

The runtime rewards an attempt by its index in the group, so every group has variance and every step
trains: the optimizer-step count is then the same in any correct run, whatever was sampled. The killed
processes are forked from a multiprocessing fork server that has imported torch and loops_nb once, so each
starts in seconds rather than the ~20 s of a cold interpreter; each is still a separate process, killed with
a real SIGKILL.
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

import loops_nb.cli
from loops_nb import load
from loops_nb.observers import TerminalReporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_chat_model

RUNTIME = '''
from loops_nb.runtime import Evidence, Task


class Steady:
    """Five tasks; the reward is the attempt's index in its group, so every group trains."""

    async def tasks(self):
        return [Task(str(i)) for i in range(5)]

    async def run_attempt(self, attempt):
        reply = await attempt.services.llm.chat([{"role": "user", "content": "Talk."}], max_tokens=8)
        return Evidence(reward=float(attempt.index) + len(reply.text) % 4 / 8)

    async def close(self):
        pass
'''

MAX_STEPS = 8
GROUPS, GROUP_SIZE = 2, 4
CONFIG = f"""
recipe = "rl"
[model]
base_model = "{{model}}"
lora_rank = 4
[compute.local]
device = "cpu"
[runtime]
factory = "steady_resume_runtime:Steady"
[training]
max_steps = {MAX_STEPS}
group_size = {GROUP_SIZE}
groups_per_step = {GROUPS}
learning_rate = 1e-3
save_every = 1
[output]
output_dir = "{{out}}"
"""
SEEDS = [(1, 1), (2, 1), (3, 2)]
"""(seed, kills): the seed picks each kill's moment; the last one crashes twice before the final resume."""


@dataclass
class Setup:
    folder: Path
    config: Path
    reference: Path


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def whole_lines(path: Path) -> int:
    """Complete records in a JSONL file a live process may be appending to."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_point(rng: random.Random, left: int, kills_to_come: int) -> tuple[int, float]:
    """(n, fraction): SIGKILL `fraction` of a step after the n-th step record appears.

    n is past the `left` records the previous kill left, so the kill lands in the new process's own steps,
    and at most MAX_STEPS - 3 when there is room for that, so three steps are still to come and it lands before
    the run ends.
    """
    room = (MAX_STEPS - 3 - left) // kills_to_come
    return left + rng.randint(1, max(1, room)), 1.5 * rng.random()


PRELOAD = [
    "loops_nb.cli",
    "loops_nb.rl.recipe",
    "loops_nb.sft.recipe",
    "loops_nb.local.trainer",
    "loops_nb.local.sampler",
]
"""What the fork server imports once: a cold interpreter takes some 20 s on two cores to get there."""


def loops_run(argv: list[str], log: str) -> None:
    """The `loops` command in this process (forked from the fork server), its output to `log`."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.exit(loops_nb.cli.main(argv))


def start_loops_run(argv: list[str], log: Path) -> BaseProcess:
    """`loops run ...` in a process of its own, forked from a fork server that has imported the stack."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    proc = context.Process(target=loops_run, args=(argv, str(log)))
    proc.start()
    return proc


def kill_after(proc: BaseProcess, steps: Path, n: int, fraction: float, log: Path) -> None:
    """SIGKILL `proc` `fraction` of a step (as long as its n-th took) after `steps` has n records."""
    deadline = time.monotonic() + 300
    while whole_lines(steps) < n:
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


def final_trainer_step(run: Path) -> int:
    """The optimizer steps the trainer had applied at the run's last checkpoint (its own count)."""
    return checkpoint_state(run, records(run / "checkpoints.jsonl")[-1]["path"])["step"]


def tear_tails(run: Path) -> None:
    """End every log of `run` in a half record, as a kill in the middle of a long append leaves it.

    A SIGKILL stops a write() part-way only when it is long (a big step's rollouts), which these tiny runs never
    write, so the test tears the last line itself; the next process must cut it off before reading the log.
    """
    for path in run.glob("*.jsonl"):
        with path.open("a") as f:
            f.write('{"step": 99, "torn')


def checkpoint_state(run: Path, path: str) -> dict:
    """trainer_state.json of a recorded checkpoint; it must be complete (saved whole before it is recorded)."""
    loops_run, _, name = path.removeprefix("bt://loops:").partition("/weights/")
    folder = run / "state" / "local_loops" / "runs" / loops_run / "weights" / name
    for part in ("trainer_state.json", "optimizer.pt", "rng.pt", "adapter/adapter_model.safetensors"):
        assert (folder / part).is_file(), f"checkpoint {path} is recorded but {part} is missing"
    return json.loads((folder / "trainer_state.json").read_text())


def tasks_per_step(run: Path) -> list[list[tuple]]:
    by_step: list[list[tuple]] = [[] for _ in range(MAX_STEPS)]
    for r in records(run / "rollouts.jsonl"):
        by_step[r["step"]].append((r["group"], r["task"], r["attempt"]))
    return by_step


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    folder = tmp_path_factory.mktemp("rl-resume")
    model = build_tiny_chat_model(folder / "model")
    (folder / "steady_resume_runtime.py").write_text(RUNTIME)
    config = folder / "train.toml"
    config.write_text(CONFIG.format(model=model, out=folder / "runs"))
    outcome = load(config, overrides={"output.run_name": "reference"}).train_sync(observers=[])
    assert outcome.status == "completed" and outcome.steps == MAX_STEPS
    return Setup(folder, config, Path(outcome.run_dir))


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "kills"), SEEDS, ids=[f"seed{s}-{k}kill" for s, k in SEEDS])
def test_a_killed_run_resumes_exactly_once(setup: Setup, seed: int, kills: int) -> None:
    name = f"killed-{seed}"
    run = setup.folder / "runs" / name
    argv = ["run", str(setup.config), "--output.run_name", name]
    killed_ids, rng = [], random.Random(seed)
    for i in range(kills):
        n, fraction = kill_point(rng, whole_lines(run / "steps.jsonl"), kills - i)
        log = setup.folder / f"{name}-{i}.log"
        kill_after(start_loops_run(argv, log), run / "steps.jsonl", n, fraction, log)
        killed_ids.append(json.loads((run / "run.json").read_text())["run_id"])
        for c in records(run / "checkpoints.jsonl"):  # the kill left no half checkpoint on the record
            checkpoint_state(run, c["path"])
        if i == 0 and kills > 1:
            tear_tails(run)

    saved = records(run / "checkpoints.jsonl")
    resume_at = saved[-1]["step"] if saved else 0  # killed before its first checkpoint: from step 0
    printed = io.StringIO()
    outcome = load(setup.config, overrides={"output.run_name": name}).train_sync(
        observers=[TerminalReporter(printed)]
    )
    assert outcome.status == "completed" and outcome.steps == MAX_STEPS
    assert outcome.start_step == resume_at
    if resume_at:
        assert f"resumed at step {resume_at}" in printed.getvalue()

    steps, reference = records(run / "steps.jsonl"), records(setup.reference / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(MAX_STEPS)), "every step exactly once, in order"
    assert [s["step"] for s in reference] == list(range(MAX_STEPS))
    # The policy version counts optimizer steps: one per step here, as in the uninterrupted run.
    assert all(s["trained"] for s in steps + reference)
    assert [s["policy_version"] for s in steps] == [s["policy_version"] for s in reference]
    assert [s["policy_version"] for s in steps] == list(range(1, MAX_STEPS + 1))
    assert final_trainer_step(run) == final_trainer_step(setup.reference) == MAX_STEPS

    # Data order: every step saw the tasks (per group, per attempt) that the reference's step saw.
    assert tasks_per_step(run) == tasks_per_step(setup.reference)
    rollouts = records(run / "rollouts.jsonl")
    assert len(rollouts) == MAX_STEPS * GROUPS * GROUP_SIZE
    assert [r["step"] for r in rollouts] == sorted(r["step"] for r in rollouts)

    for path in run.rglob("*.jsonl"):  # no half line anywhere, and every line one record
        text = path.read_text()
        assert not text or text.endswith("\n"), f"{path} ends in a half line"
        [json.loads(line) for line in text.splitlines()]
    checkpoints = records(run / "checkpoints.jsonl")
    assert [c["step"] for c in checkpoints] == sorted({c["step"] for c in checkpoints})
    assert checkpoints[-1]["step"] == MAX_STEPS and checkpoints[-1]["sampler_path"]
    for c in checkpoints:
        assert checkpoint_state(run, c["path"])["step"] == c["step"] == c["extra"]["policy_version"]
    meta = json.loads((run / "run.json").read_text())
    assert meta["previous_run_ids"] == killed_ids, "run.json keeps the Loops run id of every killed process"
