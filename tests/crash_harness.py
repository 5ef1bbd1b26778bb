"""SIGKILL a `loops run` at a random moment and check what it left: shared by the RL and SFT resume tests.

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
from typing import Any

import pytest
from helpers import read_jsonl

import loops_nb.cli
from loops_nb import load
from loops_nb.observers import TerminalReporter

PRELOAD = [
    "loops_nb.cli",
    "loops_nb.rl.recipe",
    "loops_nb.sft.recipe",
    "loops_nb.local.trainer",
    "loops_nb.local.sampler",
]
"""What the fork server imports once: a cold interpreter takes some 20 s on two cores to get there."""
SEEDS = [(1, 1), (2, 1), (3, 2)]
"""(seed, kills): the seed picks each kill's moment; the last one crashes twice before the final resume."""


@dataclass
class Setup:
    """A resume test's module fixture: its folder, its config and the uninterrupted reference run."""

    folder: Path
    config: Path
    reference: Path


def whole_lines(path: Path) -> int:
    """Complete records in a JSONL file a live process may be appending to."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_point(rng: random.Random, left: int, kills_to_come: int, total_steps: int) -> tuple[int, float]:
    """(n, fraction): SIGKILL `fraction` of a step after the n-th step record appears.

    n is past the `left` records the previous kill left, so the kill lands in the new process's own steps,
    and at most total_steps - 3 when there is room for that, so three steps are still to come and it lands
    before the run ends.
    """
    room = (total_steps - 3 - left) // kills_to_come
    return left + rng.randint(1, max(1, room)), 1.5 * rng.random()


def _loops_run(argv: list[str], log: str) -> None:
    """The `loops` command in this process (forked from the fork server), its output to `log`."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.exit(loops_nb.cli.main(argv))


def start_loops_run(argv: list[str], log: Path) -> BaseProcess:
    """`loops run ...` in a process of its own, forked from a fork server that has imported the stack."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    proc = context.Process(target=_loops_run, args=(argv, str(log)))
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


def tear_tails(run: Path) -> None:
    """End every log of `run` in a half record, as a kill in the middle of a long append leaves it.

    A SIGKILL stops a write() part-way only when it is long (a big step's rollouts), which these tiny runs never
    write, so the test tears the last line itself; the next process must cut it off before reading the log.
    """
    for path in run.glob("*.jsonl"):
        with path.open("a") as f:
            f.write('{"step": 99, "torn')


def checkpoint_dir(run: Path, path: str) -> Path:
    """The folder of a recorded checkpoint; it must be complete (saved whole before it is recorded)."""
    loops_run, _, name = path.removeprefix("bt://loops:").partition("/weights/")
    folder = run / "state" / "local_loops" / "runs" / loops_run / "weights" / name
    for part in ("trainer_state.json", "optimizer.pt", "rng.pt", "adapter/adapter_model.safetensors"):
        assert (folder / part).is_file(), f"checkpoint {path} is recorded but {part} is missing"
    return folder


def trainer_step(run: Path, path: str) -> int:
    """The optimizer steps the trainer had applied at a recorded checkpoint (its own count)."""
    return json.loads((checkpoint_dir(run, path) / "trainer_state.json").read_text())["step"]


def crash(config: Path, run: Path, logs: Path, seed: int, kills: int, total_steps: int) -> list[str]:
    """Run `config` as `run.name` and SIGKILL it `kills` times at moments the seed picks (tearing every log's
    last line after the first of several); returns the Loops run ids of the killed processes."""
    argv = ["run", str(config), "--output.run_name", run.name]
    killed_ids, rng = [], random.Random(seed)
    for i in range(kills):
        n, fraction = kill_point(rng, whole_lines(run / "steps.jsonl"), kills - i, total_steps)
        log = logs / f"{run.name}-{i}.log"
        kill_after(start_loops_run(argv, log), run / "steps.jsonl", n, fraction, log)
        killed_ids.append(json.loads((run / "run.json").read_text())["run_ids"][-1])
        for c in read_jsonl(run / "checkpoints.jsonl", missing_ok=True):  # no half checkpoint on the record
            checkpoint_dir(run, c["path"])
        if i > 0:  # the process that resumed cut the torn tails off as it rewound, whenever it was killed
            for path in run.glob("*.jsonl"):
                text = path.read_text()
                assert not text or text.endswith("\n"), f"{path.name} still ends in the half record"
        if i == 0 and kills > 1:
            tear_tails(run)
    return killed_ids


def assert_whole_logs(run: Path) -> None:
    """No half line in any JSONL file of `run`, every line one record, checkpoints increasing and complete."""
    for path in run.rglob("*.jsonl"):
        text = path.read_text()
        assert not text or text.endswith("\n"), f"{path} ends in a half line"
        read_jsonl(path)  # every line one record
    checkpoints = read_jsonl(run / "checkpoints.jsonl", missing_ok=True)
    assert [c["step"] for c in checkpoints] == sorted({c["step"] for c in checkpoints})
    for c in checkpoints:
        assert trainer_step(run, c["path"]) == c["step"]


def resume_to_end(config: Path, run: Path) -> Any:
    """Run `config` as `run.name` in this process to the end; it must resume at the last checkpoint the kills
    left (step 0 when they left none) and say so. Returns the run's outcome."""
    saved = read_jsonl(run / "checkpoints.jsonl", missing_ok=True)
    resume_at = saved[-1]["step"] if saved else 0  # killed before its first checkpoint: from step 0
    printed = io.StringIO()
    outcome = load(config, overrides={"output.run_name": run.name}).train_sync(
        observers=[TerminalReporter(printed)]
    )
    assert outcome.status == "completed" and outcome.start_step == resume_at
    if resume_at:
        assert f"resumed at step {resume_at}" in printed.getvalue()
    return outcome
