"""`add_update_in_place` against PEFT's own LoRA forward (its twin): the same outputs and LoRA gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import Linear as LoraLinear

from loops_nb.local import lora_in_place
from loops_nb.local.lora_in_place import add_update_in_place


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(12, 20)
        self.down = torch.nn.Linear(20, 12, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def twins(dropout: float = 0.0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["up", "down"])
    peft = get_peft_model(Block(), config)
    for name, param in peft.named_parameters():
        if "lora_B" in name:  # B starts at 0; a non-zero B makes the update visible
            torch.nn.init.normal_(param)
    fused = copy.deepcopy(peft)
    assert add_update_in_place(fused) == 2
    return peft, fused


def outputs_and_grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return [out.detach()] + [p.grad for p in model.parameters() if p.requires_grad]  # type: ignore[misc]


def test_the_in_place_update_gives_peft_outputs_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    peft, fused = twins()
    taken: list[int] = []
    real = lora_in_place._plain_update
    monkeypatch.setattr(lora_in_place, "_plain_update", lambda *a: taken.append(1) or real(*a))
    x = torch.randn(3, 5, 12)
    theirs, mine = outputs_and_grads(peft, x), outputs_and_grads(fused, x)
    assert len(taken) == 2 and isinstance(fused.base_model.model.up, LoraLinear)
    assert len(mine) == len(theirs) == 5
    for a, b in zip(mine, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())
    with torch.inference_mode():
        assert torch.allclose(fused(x), peft(x), atol=1e-5, rtol=0)


def test_dropout_at_work_and_a_disabled_adapter_run_peft_forward() -> None:
    peft, fused = twins(dropout=0.5)
    fused.train()
    x = torch.randn(4, 12)
    torch.manual_seed(1)
    theirs = peft.train()(x)
    torch.manual_seed(1)
    assert torch.equal(fused(x), theirs), "dropout in training takes PEFT's path, drawing the same mask"
    with fused.disable_adapter(), peft.disable_adapter():
        assert torch.equal(fused(x), peft(x))
