"""Precision of the embedded Loops: what the sampler reports for the tokens it drew and what the trainer
computes for the same tokens agree, at T = 1, in float32 (what `dtype = "auto"` picks on a CPU), in
bf16 (its pick on CUDA, and the opt-in `dtype = "bfloat16"` on a CPU) and in `bf16-mixed` (bf16 linear
products in a float32 model, `loops_nb.local.mixed_precision`). RL's importance ratios exp(trainer lp - sampler lp) rest on
this agreement. The LoRA weights and AdamW's state stay float32 whatever the base dtype.

The issue's aim is a mean |delta| under 0.02. float32 and bf16-mixed meet it; bf16 does not:
docs/benchmarks.md records a mean of about 0.04 on SmolLM2-135M, because the trainer's full-sequence
forward and the sampler's cached one-token decode round differently in a bf16 residual stream. The
bf16 bound below guards that level against regressions; it is not the aim.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from baseten.loops import AdamParams, Datum, ModelInput, TensorData

from loops_nb.local.sampler import SamplerEngine
from loops_nb.local.sampling_types import SampleRequest
from loops_nb.local.trainer import LoraTrainer

pytestmark = pytest.mark.slow

PROMPT = "Write a short story about a lighthouse keeper."
MEAN_BOUND = {"float32": 0.02, "bf16-mixed": 0.02, "bf16": 0.06}
"""float32 and bf16-mixed: the issue's aim. bf16: the measured 0.04 with headroom (the aim is missed there)."""
PRECISIONS = {
    "float32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16-mixed": (torch.float32, True),
}
"""Test id -> (base dtype, bf16 linear products), as `device_and_dtype` and `bf16_products` give them."""


def datum(tokens: list[int]) -> Datum:
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1])},
    )


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_sampler_and_trainer_logprobs_agree_at_temperature_1(smollm2_path: Path, precision: str) -> None:
    dtype, products = PRECISIONS[precision]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    trainer = LoraTrainer(smollm2_path, device=torch.device("cpu"), dtype=dtype, bf16_products=products)
    trainer.init(8, seed=0)
    # One step on the prompt itself, so the adapter is not zero and the sampler serves a real policy.
    trainer.forward_backward([datum(prompt)])
    trainer.optim_step(AdamParams(learning_rate=1e-3))
    lora = trainer.lora_parameters()
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert trainer.model.get_base_model().get_output_embeddings().weight.dtype == dtype
    moments = [s for state in trainer._optimizer.state.values() for s in state.values() if s.numel() > 1]  # type: ignore[union-attr]
    assert moments and all(m.dtype == torch.float32 for m in moments)

    base = trainer.model.get_base_model()
    products_dtype = base.model.layers[0].mlp.down_proj.base_layer.weight.dtype
    assert products_dtype == (torch.bfloat16 if products else dtype)

    with SamplerEngine(smollm2_path, device="cpu", dtype=dtype, bf16_products=products) as engine:
        engine.set_adapter("policy", trainer.lora_config_dict(), trainer.adapter_state_dict(), 1)
        request = SampleRequest(prompt=prompt, n=4, temperature=1.0, max_tokens=24, seed=3)
        result = engine.sample(request, "policy")
    sequences = [(prompt + list(c.token_ids), list(c.logprobs)) for c in result.choices]
    out = trainer.forward([datum(tokens) for tokens, _ in sequences])
    deltas = []
    for (_, sampled), entry in zip(sequences, out.loss_fn_outputs, strict=True):
        trained = entry["logprobs"].data[len(prompt) - 1 :]
        assert len(trained) == len(sampled)
        deltas += [abs(a - b) for a, b in zip(trained, sampled, strict=True)]
    mean = sum(deltas) / len(deltas)
    assert mean < MEAN_BOUND[precision], f"mean |delta| {mean:.4f}, max {max(deltas):.4f}"
