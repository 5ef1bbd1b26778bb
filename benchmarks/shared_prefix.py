"""Shared-prefix forward-backward: a trainer step on quickstart-shaped groups, prompt shared against not.

Run: `uv run python -m benchmarks shared_prefix`.

The quickstart trains 4 groups of 16 samples a step; a group's samples share a 44-token prompt and their
completions are about 20 tokens, so most of the trainer's tokens are the prompt again. One
`forward_backward` (importance sampling, as the recipe's default loss) of such a request on SmolLM2 float32,
through the trainer with `share_prefixes` on and off, run alternately on the compute lane after a warm-up,
median of `ROUNDS` rounds (2: a step at the default budget takes about half a minute a side on 2 CPU cores,
so more rounds would take the benchmark past ten minutes). The aim (issue 35): <= 0.5x the unshared step.

It runs at two budgets, each the same for both sides. At the default one (a quarter of the weights, 128 MiB,
as the quickstart runs) a token keeps 1.2 MB of activations with every layer kept, so three rows of a group
would fit a micro-batch; the planner (`prefix_packing`, `activation_memory.RECOMPUTE_COST`) instead
recomputes the layers of a group's micro-batch (110 KB a token) so that its 16 rows run their prompt once.
With room for a group (`GROUP_BUDGET_MB`) a group's 16 rows run their prompt once with every layer kept.
The tokens row is what steps.jsonl records: `trainer/computed_tokens` against `trainer/total_tokens`.
On a CPU shared with other work, run it with `OMP_NUM_THREADS=1`: two OpenMP threads on two loaded cores
measured the waits, not the code (docs/benchmarks.md).

Deliberate simplifications: random prompt and completion tokens, every completion token trained with a
non-zero advantage, the trainer called directly (the SDK path adds the same wire cost to both sides).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from baseten.loops import Datum

from benchmarks.common import Result, model_path
from benchmarks.trainer import alternate

GROUPS, GROUP_SIZE, PROMPT_TOKENS, COMPLETION_TOKENS = 4, 16, 44, 20
ROUNDS = 2
GROUP_BUDGET_MB = 640
"""Room for one group's shared forward on SmolLM2 float32 (about 440 MB of activations), not for two."""


def request(vocab: int, seed: int = 0) -> list[Datum]:
    rng = random.Random(seed)
    data = []
    for _ in range(GROUPS):
        prompt = [rng.randrange(100, vocab) for _ in range(PROMPT_TOKENS)]
        for _ in range(GROUP_SIZE):
            length = COMPLETION_TOKENS + rng.randrange(-4, 5)
            seq = prompt + [rng.randrange(100, vocab) for _ in range(length)]
            n = len(seq) - 1

            def td(values: list[float], dtype: str = "float32") -> dict:
                return {"data": values, "dtype": dtype, "shape": [len(values)]}

            mask = [0.0] * (PROMPT_TOKENS - 1) + [1.0] * length
            data.append(
                Datum.model_validate(
                    {
                        "model_input": {"chunks": [{"type": "encoded_text", "tokens": seq[:-1]}]},
                        "loss_fn_inputs": {
                            "target_tokens": td(seq[1:], "int64"),
                            "logprobs": td([-3.0] * n),
                            "advantages": td([rng.choice([-1.0, 1.0])] * n),
                            "mask": td(mask),
                        },
                    }
                )
            )
    return data


def run() -> list[Result]:
    from loops_nb.local.compute_lane import COMPUTE_LANE
    from loops_nb.local.trainer import LoraTrainer

    path = model_path()
    results = []
    for budget, label in ((None, "default budget"), (GROUP_BUDGET_MB, f"{GROUP_BUDGET_MB} MB budget")):
        metrics: dict[bool, dict[str, float]] = {}

        def side(share: bool, budget: int | None = budget, metrics: dict = metrics) -> Callable[[], None]:
            def build() -> Callable[[], None]:
                trainer = LoraTrainer(path, dtype=torch.float32, memory_budget_mb=budget)
                trainer.init(16, seed=0)
                trainer.share_prefixes = share
                data = request(trainer.vocab_size)

                def step() -> None:
                    out = COMPUTE_LANE.run(lambda: trainer.forward_backward(data, "importance_sampling"))
                    metrics[share] = out.metrics
                    trainer.model.zero_grad(set_to_none=True)

                return step

            return COMPUTE_LANE.run(build)

        times = alternate({"shared": side(True), "whole": side(False)}, ROUNDS)
        tokens = GROUPS * GROUP_SIZE * (PROMPT_TOKENS + COMPLETION_TOKENS)
        results.append(
            Result(
                f"trainer forward_backward, {GROUPS} groups x {GROUP_SIZE} sharing a {PROMPT_TOKENS}-token prompt, "
                f"{label} (tokens/s; shared prompt vs every row whole)",
                tokens / times["shared"][0],
                tokens / times["whole"][0],
                "tok/s",
                ">= 2.0 (step <= 0.5x)",
            )
        )
        shared = metrics[True]
        results.append(
            Result(
                f"trainer/computed_tokens against trainer/total_tokens, {label}, shared",
                shared["trainer/computed_tokens"],
                shared["trainer/total_tokens"],
                "tokens",
                "informational",
            )
        )
    return results
