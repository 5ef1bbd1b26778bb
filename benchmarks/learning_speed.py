"""Learning speed: wall time until the quickstart's mean reward reaches 0.7 on the local default model,
median of 3 seeds, with the settings the quickstart ships (patterns/custom_runtime/in_process_direct/
train_local.toml). The clock starts when `train()` is called, so it includes starting the embedded
Loops and loading the model, as a user waits for them. A seed that never reaches 0.7 within
max_steps counts as infinite (and the median says so).

The quickstart's `[eval]` (16 attempts on the base model before the first step, and 16 after the last) is
turned off here: it measures the model, not how fast it learns, and the row's history (59 s on 2026-12-01)
predates it. On a CPU with AMX or AVX512-BF16 the same three seeds run again at `dtype = "bf16-mixed"`.
"""

from __future__ import annotations

import math
import statistics

from benchmarks.common import Result
from benchmarks.quickstart_runs import run_quickstart
from benchmarks.trainer import mixed_side

SEEDS = (0, 1, 2)
TARGET = 0.7


def seconds_to_target(overrides: dict[str, object]) -> list[float]:
    """Each seed's wall seconds to reward/mean >= TARGET with these settings (inf where never)."""
    seconds = []
    for seed in SEEDS:
        clock = run_quickstart({"training.seed": seed, "eval.enabled": False, **overrides})
        reached = clock.seconds_to_reward(TARGET)
        seconds.append(reached if reached is not None else math.inf)
        wait, train = clock.mean_split_after_first()
        print(
            f"  {overrides or 'defaults'} seed {seed}: reward >= {TARGET} after "
            f"{reached if reached is not None else 'never'} s "
            f"(rewards {[round(r or 0, 3) for _, r in clock.steps]}); first step ended at "
            f"{clock.first_step_at or 0:.0f} s; later steps: {wait:.1f} s waiting for rollouts, "
            f"{train:.1f} s training and publishing",
            flush=True,
        )
    return seconds


def run() -> list[Result]:
    sides: dict[str, dict[str, object]] = {"": {}}
    if mixed_side():
        sides[', dtype = "bf16-mixed"'] = {"compute.local.dtype": "bf16-mixed"}
    results = []
    for label, overrides in sides.items():
        seconds = seconds_to_target(overrides)
        results.append(
            Result(
                f"quickstart wall time to reward/mean >= {TARGET}, median of seeds {list(SEEDS)}{label}",
                statistics.median(seconds),
                float("nan"),
                "s",
                "informational (seeds: "
                + ", ".join("never" if math.isinf(s) else f"{s:.0f}s" for s in seconds)
                + ")",
                higher_is_better=False,
            )
        )
    return results
