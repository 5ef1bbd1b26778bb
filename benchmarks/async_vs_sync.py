"""Async vs sync scheduling: wall time per step on the quickstart, async (max_staleness 1) over sync.
Aim: <= 0.7. Every run uses the quickstart's shipped settings and seed, each in a fresh process; the
first step (model load, warm-up) is left out of the per-step time.

Run: `uv run python -m benchmarks async_vs_sync`.

In async mode the next step's attempts sample while the trainer trains, so the ratio shows how much of
the sampler's and the trainer's time overlap. The rows:

- async with `stale_policy = "pace"` (the default) and with `"requeue"`, each over sync;
- the same pair with `OMP_WAIT_POLICY=PASSIVE` (idle OpenMP threads sleep instead of spinning). On a
  CPU the trainer and the sampler now compute on one thread (`loops_nb/local/compute_lane.py`), so
  their work no longer overlaps at all; this row shows whether the setting still matters;
- the bound: sync's mean (rollout wait, train + publish) per step; perfect overlap would make a step
  cost the larger of the two, so max / sum is the best ratio async can reach on this machine.
"""

from __future__ import annotations

from benchmarks.common import Result
from benchmarks.quickstart_runs import run_quickstart_isolated

STEPS = 5
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def run() -> list[Result]:
    base = {"training.max_steps": STEPS}
    sync_run = {**base, "training.mode": "sync"}
    async_run = {**base, "training.mode": "async", "training.max_staleness": 1}
    sync = run_quickstart_isolated(sync_run)
    pace = run_quickstart_isolated({**async_run, "training.stale_policy": "pace"})
    requeue = run_quickstart_isolated({**async_run, "training.stale_policy": "requeue"})
    sync_passive = run_quickstart_isolated(sync_run, PASSIVE)
    pace_passive = run_quickstart_isolated({**async_run, "training.stale_policy": "pace"}, PASSIVE)
    rollout, train = sync.mean_split_after_first()
    per_step = sync.seconds_per_step_after_first()
    name = f"quickstart seconds/step, steps 2-{STEPS}"
    return [
        Result(
            f"{name}, async (staleness 1, pace: the default) vs sync",
            pace.seconds_per_step_after_first(),
            per_step,
            "s",
            "<= 0.7 (async / sync)",
        ),
        Result(
            f"{name}, async requeue vs sync", requeue.seconds_per_step_after_first(), per_step, "s", "<= 0.7"
        ),
        Result(
            f"{name}, async pace vs sync, both with OMP_WAIT_POLICY=PASSIVE",
            pace_passive.seconds_per_step_after_first(),
            sync_passive.seconds_per_step_after_first(),
            "s",
            "<= 0.7",
        ),
        Result(
            f"sync step split: rollout wait {rollout:.1f} s, train+publish {train:.1f} s; best overlap",
            max(rollout, train),
            rollout + train,
            "s",
            "bound on async / sync",
        ),
    ]
