"""Run the benchmarks and print one table of ratios.

uv run python -m benchmarks [trainer] [sampler] [prefix_cache] [agent_prefill] [shared_prefix]
                           [sft_check] [renderers] [orchestration] [async_vs_sync]
                           [learning_speed] [trl_grpo] [memory]

`trl_grpo` needs TRL, which only the opt-in `bench` group installs:
uv run --all-extras --group bench python -m benchmarks trl_grpo

The speed rows come first, in one table of ratios; `memory` then prints the peak resident memory of whole
runs and servers (benchmarks/peak_memory.py) in a table of its own.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ALL = (
    "trainer",
    "sampler",
    "prefix_cache",
    "agent_prefill",
    "shared_prefix",
    "sft_check",
    "renderers",
    "orchestration",
    "async_vs_sync",
    "learning_speed",
    "trl_grpo",
    "memory",
)


def main(argv: list[str]) -> int:
    from benchmarks.common import machine

    names = argv or list(ALL)
    unknown = [n for n in names if n not in ALL]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {', '.join(ALL)}", file=sys.stderr)
        return 2
    print(f"machine: {machine()}\n")
    speed = [n for n in names if n != "memory"]
    if speed:
        print("| benchmark | loops_nb | reference | ratio | aim |\n|---|---|---|---|---|")
    for name in speed:
        for result in importlib.import_module(f"benchmarks.{name}").run():
            print(result.row(), flush=True)
    if "memory" in names:
        from benchmarks import peak_memory

        print("\n| memory | peak RSS | single process | wall | aim |\n|---|---|---|---|---|")
        for line in peak_memory.run():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
