"""A multi-turn tool agent's steps, sampler prefix cache on against off: prefill tokens and rollout time.

Run: `uv run python -m benchmarks agent_prefill`.

The in_process_tools pattern (patterns/custom_runtime/in_process_tools/train_local.toml: a shopping agent
with a calculator and a price lookup, up to 6 turns on SmolLM2 with `chatml-tools`) trains 2 steps, once with
the sampler's prefix cache at its default budget and once with `[compute.local] prefix_cache_mb = 0`. From
each run's steps.jsonl: the prompt tokens the sampler ran through the model (`sampler/prefill_tokens`), those
it served from the cache (`sampler/prefix_cached_tokens`), and the seconds the step waited for its
rollouts (`time/rollout_s`). An agent's next call sends its whole history again; with the cache only the new
tokens (the tool's result, the next turn's header) are prefilled.

Deliberate simplifications: 2 groups of 4 attempts a step instead of 4 of 8 (a CPU), 2 steps, one seed;
the two runs sample differently once the first step's update differs, so the token counts are of similar,
not identical, attempts (the counters say which share of each run's prompt tokens was prefilled).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import Result

PATTERN = Path(__file__).resolve().parents[1] / "patterns/custom_runtime/in_process_tools/train_local.toml"
SMALLER = {"training.max_steps": 2, "training.group_size": 4, "training.groups_per_step": 2}


def run_pattern(prefix_cache_mb: int | None) -> list[dict[str, Any]]:
    """The pattern's steps.jsonl records, trained with this prefix cache budget (None: the default)."""
    from loops_nb import load

    with tempfile.TemporaryDirectory() as out:
        overrides: dict[str, Any] = {
            **SMALLER,
            "output.output_dir": out,
            "output.run_name": f"prefill-{prefix_cache_mb}",
            "output.trace": "samples",
        }
        if prefix_cache_mb is not None:
            overrides["compute.local.prefix_cache_mb"] = prefix_cache_mb
        outcome = load(PATTERN, overrides=overrides).train_sync(observers=[])
        lines = (Path(outcome.run_dir) / "steps.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def totals(steps: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(prefilled tokens, cached tokens, rollout seconds) per step, over the run's steps."""
    n = max(len(steps), 1)
    prefilled = sum(float(s.get("sampler/prefill_tokens") or 0) for s in steps) / n
    cached = sum(float(s.get("sampler/prefix_cached_tokens") or 0) for s in steps) / n
    rollout = sum(float(s.get("time/rollout_s") or 0) for s in steps) / n
    return prefilled, cached, rollout


def run() -> list[Result]:
    on, off = totals(run_pattern(None)), totals(run_pattern(0))
    for label, (prefilled, cached, rollout) in (("cache on", on), ("cache off", off)):
        share = prefilled / (prefilled + cached) if prefilled + cached else 0.0
        print(
            f"  {label}: {prefilled:,.0f} prompt tokens prefilled and {cached:,.0f} served from the cache a step "
            f"({share:.0%} prefilled); {rollout:.1f} s a step waiting for rollouts",
            flush=True,
        )
    share_on = on[0] / (on[0] + on[1]) if on[0] + on[1] else 1.0
    share_off = off[0] / (off[0] + off[1]) if off[0] + off[1] else 1.0
    return [
        Result(
            "in_process_tools agent step: share of prompt tokens prefilled, prefix cache on vs off",
            share_on,
            share_off,
            "",
            "informational",
            higher_is_better=False,
        ),
        Result(
            "in_process_tools agent step: seconds waiting for rollouts, prefix cache on vs off",
            on[2],
            off[2],
            "s",
            "informational",
            higher_is_better=False,
        ),
    ]
