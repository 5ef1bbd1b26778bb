"""Helpers written the way Tinker's docs and tinker-cookbook write them, for the compat loops.

A "renderer" here is the tokenizer's chat template: the prompt part of a conversation gets weight 0 and
the assistant's reply weight 1, then the sequence is shifted by one (input = tokens[:-1], targets =
tokens[1:]), which is what a cookbook datum is. The mean NLL is computed as the cookbook's SL loop
computes it: the dot product of each datum's returned logprobs with its weights, over the total weight.
"""

from __future__ import annotations

import numpy as np
import tinker
from tinker import types


def conversation_datum(tokenizer, conversation: list[dict[str, str]]) -> types.Datum:
    prompt = tokenizer.apply_chat_template(
        conversation[:-1], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    full = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
    prompt, full = list(prompt), list(full)
    weights = [0.0] * len(prompt) + [1.0] * (len(full) - len(prompt))
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=full[1:], dtype="int64", shape=[len(full) - 1]),
            "weights": tinker.TensorData(data=weights[1:], dtype="float32", shape=[len(full) - 1]),
        },
    )


def mean_nll(logprobs: list[tinker.TensorData], weights: list[tinker.TensorData]) -> float:
    """−Σ logprobs·weights / Σ weights over the batch: NaN if any weighted-or-not logprob is null."""
    total = sum(
        float(np.dot(np.array(lp.data, dtype=float), np.array(w.data)))
        for lp, w in zip(logprobs, weights, strict=True)
    )
    return -total / sum(float(np.sum(w.data)) for w in weights)
