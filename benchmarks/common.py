"""Shared pieces: the result row, timing, and the model the benchmarks use."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

MODEL = os.environ.get("LOOPS_NB_BENCH_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")


@dataclass
class Result:
    name: str
    ours: float
    reference: float
    unit: str
    aim: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        if self.higher_is_better:
            return self.ours / self.reference if self.reference else float("nan")
        return self.reference / self.ours if self.ours else float("nan")

    def row(self) -> str:
        return f"| {self.name} | {self.ours:.4g} {self.unit} | {self.reference:.4g} {self.unit} | {self.ratio:.2f} | {self.aim} |"


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    return f"{platform.machine()} {device}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def model_path():
    from loops_nb.local.model_store import resolve_model

    return resolve_model(MODEL).path


def on_compute_lane(build: Callable[[], Callable[[], None]]) -> Callable[[], None]:
    """`build()` a reference side and return its step, both run on the embedded Loops' compute lane.

    torch's CPU kernels run through OpenMP, which keeps a thread pool for each thread that computes; a
    reference computing on the main thread next to the lane would make two pools, and on a machine with
    few cores libgomp then puts idle workers to sleep after every parallel region, slowing both sides
    (see `loops_nb/local/compute_lane.py`). On the lane, every side shares one pool, as a user's run does.
    """
    from loops_nb.local.compute_lane import COMPUTE_LANE

    step = COMPUTE_LANE.run(build)
    return lambda: COMPUTE_LANE.run(step)
