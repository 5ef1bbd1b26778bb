"""`dtype = "bf16-mixed"`: bf16 linear products in a float32 model (loops_nb/local/mixed_precision.py).

What it must keep: the head, the embeddings and the norms float32; every other linear layer bf16 that
takes and returns float32; PEFT wrapping and training those layers with float32 LoRA weights; its own
entry in the shared-base store, so a float32 run on the same model never gets bf16 products. The sampler
and trainer's agreement at bf16-mixed is measured on the real model in test_precision.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from baseten.loops import AdamParams, Datum

from loops_nb.local import model_store
from loops_nb.local.image_chunks import load_model
from loops_nb.local.lora_targets import DEFAULT_TARGETS
from loops_nb.local.memory_budget import estimate_peak
from loops_nb.local.mixed_precision import Bf16ProductLinear, use_bf16_products
from loops_nb.local.shared_base import BASE_MODELS
from loops_nb.local.trainer import LoraTrainer


def test_products_are_bf16_and_everything_else_stays_float32(tiny_chat_model: Path) -> None:
    reference = load_model(tiny_chat_model, torch.float32).eval()
    mixed = load_model(tiny_chat_model, torch.float32).eval()
    assert use_bf16_products(mixed) > 0
    head = mixed.get_output_embeddings()
    assert type(head) is torch.nn.Linear and head.weight.dtype == torch.float32
    assert mixed.get_input_embeddings().weight.dtype == torch.float32
    layer = mixed.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, Bf16ProductLinear)
    assert layer.self_attn.q_proj.weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == torch.float32
    linears = [m for m in mixed.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    assert linears and all(isinstance(m, Bf16ProductLinear) for m in linears)

    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    with torch.no_grad():
        expected = torch.log_softmax(reference(input_ids=ids).logits, -1)
        got = torch.log_softmax(mixed(input_ids=ids).logits, -1)
    assert got.dtype == torch.float32
    # bf16 inputs to each product: close to float32, but not equal (the products really are bf16).
    assert 0 < (got - expected).abs().max() < 0.1


def test_a_mixed_trainer_trains_float32_lora_on_bf16_products(tiny_chat_model: Path) -> None:
    trainer = LoraTrainer(
        tiny_chat_model, device=torch.device("cpu"), dtype=torch.float32, bf16_products=True
    )
    trainer.init(4, seed=0)
    base = trainer.model.get_base_model()
    q_proj = base.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj.base_layer, Bf16ProductLinear)
    assert all(p.dtype == torch.float32 for p in trainer.lora_parameters())
    tokens = list(range(3, 40))
    datum = Datum.model_validate(
        {
            "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens[:-1]}]},
            "loss_fn_inputs": {
                "target_tokens": {"data": tokens[1:], "dtype": "int64", "shape": [len(tokens) - 1]}
            },
        }
    )
    before = trainer.forward([datum]).loss_fn_outputs[0]["logprobs"].data
    for _ in range(3):
        trainer.forward_backward([datum])
        trainer.optim_step(AdamParams(learning_rate=1e-2))
    after = trainer.forward([datum]).loss_fn_outputs[0]["logprobs"].data
    assert sum(after) > sum(before)  # the LoRA weights moved, and in the direction of the targets


def test_mixed_and_float32_bases_are_kept_apart(tiny_chat_model: Path) -> None:
    device = torch.device("cpu")
    plain = BASE_MODELS.instance(tiny_chat_model, device, torch.float32)
    mixed = BASE_MODELS.instance(tiny_chat_model, device, torch.float32, bf16_products=True)
    assert plain.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    assert mixed.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    again = BASE_MODELS.instance(tiny_chat_model, device, torch.float32, bf16_products=True)
    assert again.model.layers[0].mlp.up_proj.weight is mixed.model.layers[0].mlp.up_proj.weight


def test_the_setting_is_a_float32_model_with_bf16_products(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for fast in (True, False):
        monkeypatch.setattr(model_store, "cpu_has_fast_bf16", lambda fast=fast: fast)
        caplog.clear()
        assert model_store.device_and_dtype("cpu", "bf16-mixed") == (torch.device("cpu"), torch.float32)
        emulated = [r for r in caplog.records if "bf16 is emulated" in r.getMessage()]
        assert bool(emulated) is not fast
    assert model_store.bf16_products("bf16-mixed")
    assert not any(model_store.bf16_products(d) for d in ("auto", "float32", "bfloat16", "float16"))


def test_check_counts_the_bf16_products_at_two_bytes(tiny_chat_model: Path) -> None:
    def weights(products: bool) -> int:
        return estimate_peak(
            tiny_chat_model,
            element_bytes=4,
            lora_rank=8,
            targets=DEFAULT_TARGETS,
            max_seq_len=128,
            concurrent_sequences=4,
            bf16_products=products,
        ).weights

    model = load_model(tiny_chat_model, torch.float32)
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if type(m) is torch.nn.Linear and m is not head)
    assert weights(False) - weights(True) == 2 * linear
