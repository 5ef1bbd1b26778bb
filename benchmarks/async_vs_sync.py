"""Async vs sync scheduling: wall time per step on the quickstart, async (max_staleness 1) over sync.
Aim: <= 0.7. Both runs use the quickstart's shipped settings and seed; the first step (model load,
warm-up) is left out of the per-step time.

In async mode the next step's attempts sample while the trainer trains, so the ratio shows how much of
the sampler's and the trainer's time overlap. On a CPU-only machine both share the same cores, which
caps what overlap can give.
"""

from __future__ import annotations

from benchmarks.common import Result
from benchmarks.quickstart_runs import run_quickstart

STEPS = 5


def run() -> list[Result]:
    sync = run_quickstart({"training.max_steps": STEPS, "training.mode": "sync"})
    asynchronous = run_quickstart(
        {"training.max_steps": STEPS, "training.mode": "async", "training.max_staleness": 1}
    )
    return [
        Result(
            f"quickstart seconds/step, async (staleness 1) vs sync, steps 2-{STEPS}",
            asynchronous.seconds_per_step_after_first(),
            sync.seconds_per_step_after_first(),
            "s",
            "<= 0.7 (async / sync)",
        )
    ]
