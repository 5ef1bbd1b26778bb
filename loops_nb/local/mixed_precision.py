"""`dtype = "bf16-mixed"`: bf16 matrix products in a float32 model, for CPUs that multiply bf16 in hardware.

Pure bf16 (`dtype = "bfloat16"`) rounds the residual stream, the norms and the logits to bf16 at every
layer. The trainer's full-sequence forward and the sampler's cached one-token decode then round
differently, and their logprobs for the same tokens disagree by about 0.04 on average (docs/benchmarks.md),
twice what RL's importance ratios are meant to tolerate. Here only the decoder's linear layers hold bf16
weights: each casts its float32 input to bf16, multiplies (the part that costs, which AVX512-BF16 does at
twice float32's rate and AMX faster still) and hands back float32. The embeddings, the norms, the
attention softmax, the residual adds, the KV cache and the LM head stay float32, so only each product's
input and output are rounded to bf16, and the logits are not rounded at all. Measured on SmolLM2-135M
(8 samples of 48 tokens at T = 1): a mean |delta| of 0.014, max 0.105, between sampler and
trainer (pure bf16: 0.038, max 0.289; float32: 0).

The LM head stays float32 because it is where rounding costs most: logits of 10 to 30 have a bf16 step
of 0.06 to 0.125, and with the head (and the embeddings tied to it) in bf16 too the mean |delta| was
0.030. Many small models tie it to the input embeddings, so keeping it also keeps them exact.

PEFT wraps these layers as it wraps any `nn.Linear` (the class below is one), and a LoRA adapter's own
weights stay float32 and see the float32 input.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Bf16ProductLinear(torch.nn.Linear):
    """A frozen linear layer with bf16 weights that takes and returns float32: only the product is bf16."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input.to(self.weight.dtype), self.weight, self.bias).to(input.dtype)


def use_bf16_products(model: PreTrainedModel) -> int:
    """Turn every linear layer of `model` but its output head into a `Bf16ProductLinear`, in place.

    `model` must be float32; returns how many layers changed. The head (and an embedding tied to it) stays
    float32 (see the module docstring)."""
    head = model.get_output_embeddings()
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module is not head:
            module.to(torch.bfloat16)
            module.__class__ = Bf16ProductLinear
            changed += 1
    # The float32 tensors that stay may be views of the checkpoint file's mapping, as loaded. While any
    # is, the whole mapping stays, and with it every page the conversion read: measured on SmolLM2-135M,
    # 0.62 GB resident on top of the float32 model. Copies of their own let the mapping go.
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            if tensor.dtype != torch.bfloat16:
                tensor.data = tensor.data.clone()
    return changed
