"""Examples to trainer datums (Loops' alignment: target ``i`` is the token after input ``i``), and the held-out
loss: the token-weighted mean negative log-likelihood of the trained tokens, computed here from the trainer's
per-token logprobs so that it means the same on every scope (docs/reference/sft.md#a-step).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loops_nb.sft.batching import pack
from loops_nb.sft.targets import Example

if TYPE_CHECKING:
    from baseten.loops import TrainingClient


def example_datum(example: Example) -> Any:
    """The cross-entropy datum of one example."""
    from baseten.loops import Datum, TensorData

    from loops_nb.llm.model_input import model_input

    ids, weights = example.input_ids, example.weights
    n = len(ids) - 1
    return Datum(
        model_input=model_input(ids[:-1], example.images),
        loss_fn_inputs={
            "target_tokens": TensorData(data=ids[1:], dtype="int64", shape=[n]),
            "weights": TensorData(data=[float(w) for w in weights[1:]], dtype="float32", shape=[n]),
        },
    )


def weighted_nll(examples: Sequence[Example], outputs: Sequence[Any]) -> tuple[float, float]:
    """``(sum of w * -logprob, sum of w)`` over the trained targets of ``examples``, from a forward's outputs."""
    total = weight = 0.0
    for example, output in zip(examples, outputs, strict=True):
        logprobs = output["logprobs"]
        values = logprobs.data if hasattr(logprobs, "data") else logprobs
        for w, lp in zip(example.weights[1:], values, strict=True):
            if w > 0 and lp is not None and math.isfinite(lp):
                total -= w * lp
                weight += w
    return total, weight


@dataclass(frozen=True)
class EvalResult:
    loss: float
    """Token-weighted mean negative log-likelihood of the trained tokens."""
    examples: int
    tokens: float
    """Sum of the trained tokens' weights (their count, for 0/1 weights)."""

    def record(self) -> dict[str, float]:
        return {"eval/loss": self.loss, "eval/examples": self.examples, "eval/tokens": self.tokens}


async def held_out_loss(
    training_client: TrainingClient, examples: Sequence[Example], batch_tokens: int
) -> EvalResult:
    """Forward only (no gradient, no optimizer state touched), in requests of at most ``batch_tokens`` tokens."""
    bounds = pack(range(len(examples)), [e.n_tokens for e in examples], batch_tokens)
    total = weight = 0.0
    for start, end in itertools.pairwise(bounds):
        chunk = examples[start:end]
        future = await training_client.forward_async(
            [example_datum(e) for e in chunk], loss_fn="cross_entropy"
        )
        out = await future.result_async()
        t, w = weighted_nll(chunk, out.loss_fn_outputs)
        total, weight = total + t, weight + w
    return EvalResult(total / weight if weight else math.nan, len(examples), weight)
