"""`LoraTrainer` on a tiny random Llama: Loops op semantics, numerics against plain torch, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from baseten.loops import AdamParams, Datum, ForwardBackwardOutput, InitTrainerServerResponse

from loops_nb.local.bad_request import BadRequest
from loops_nb.local.trainer import LoraTrainer

ADAM = AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0, grad_clip_norm=1.0)


def td(data: list, dtype: str = "float32") -> dict:
    return {"data": data, "dtype": dtype, "shape": [len(data)]}


def datum(seq: list[int], weights: list[float] | None = None, **inputs: dict) -> Datum:
    """Tinker convention: input = seq[:-1], target = seq[1:] (no server-side shift)."""
    lfi = {"target_tokens": td(seq[1:], "int64"), **inputs}
    if weights is not None:
        lfi["weights"] = td(weights)
    return Datum.model_validate(
        {"model_input": {"chunks": [{"type": "encoded_text", "tokens": seq[:-1]}]}, "loss_fn_inputs": lfi}
    )


BATCH_A = [datum([1, 5, 9, 13, 17, 21, 25]), datum([2, 4, 6, 8], [0.0, 1.0, 1.0])]
BATCH_B = [datum([3, 30, 60, 90, 120, 7, 8, 9, 10], [1.0] * 8), datum([100, 101], [2.0])]


@pytest.fixture
def trainer(tiny_llama_path: Path) -> LoraTrainer:
    t = LoraTrainer(tiny_llama_path, dtype=torch.float32)  # compared with float32 references
    t.init(8, seed=0)
    return t


def lora_weights(t: LoraTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.adapter_state_dict().items()}


def grads(t: LoraTrainer) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in t.lora_parameters()]


def values(out: ForwardBackwardOutput, i: int, key: str = "logprobs") -> list[float]:
    return [math.nan if v is None else v for v in out.loss_fn_outputs[i][key].data]


def reference_logprobs(t: LoraTrainer, d: Datum) -> torch.Tensor:
    """Independent computation: unpadded forward of one datum + full log_softmax + gather."""
    tokens = torch.tensor([d.model_input.to_ints()])
    target = torch.tensor(d.loss_fn_inputs["target_tokens"].data)
    with torch.no_grad():
        logits = t.model(input_ids=tokens).logits[0]
    return logits.log_softmax(-1).gather(-1, target.clamp_min(0)[:, None])[:, 0]


def test_init_result_and_cross_entropy_learns(trainer: LoraTrainer) -> None:
    assert trainer.init(8, seed=0) == InitTrainerServerResponse(step=0, lora_rank=8)
    losses = []
    for _ in range(10):
        out = trainer.forward_backward(BATCH_A)
        losses.append(out.loss)
        metrics = trainer.optim_step(ADAM).metrics
    assert losses[-1] < losses[0] - 0.3
    assert trainer.step == 10 and metrics["step"] == 10.0 and metrics["tokens"] == 8.0
    assert set(metrics) == {"grad_norm", "learning_rate", "step", "tokens"}
    assert out.loss_fn_output_type == "cross_entropy" and out.metrics["loss"] == out.loss


def test_logprobs_match_plain_forward_and_nulls(trainer: LoraTrainer) -> None:
    trainer.forward_backward(BATCH_A + BATCH_B)
    trainer.optim_step(ADAM)  # a non-trivial adapter, so LoRA is part of what is compared
    data = [*BATCH_A, datum([7, 8, 9, 10, 11]), *BATCH_B]
    data[2].loss_fn_inputs["target_tokens"].data[1] = -100
    out = trainer.forward(data)
    assert len(out.loss_fn_outputs) == len(data)
    for i, d in enumerate(data):
        ref = reference_logprobs(trainer, d)
        got = torch.tensor(values(out, i))
        ignored = torch.tensor(d.loss_fn_inputs["target_tokens"].data) == -100
        assert got[ignored].isnan().all()  # -100 positions are null on the wire; weight-0 ones are not
        torch.testing.assert_close(got[~ignored], ref[~ignored].float(), atol=1e-5, rtol=0)
    assert data[1].loss_fn_inputs["weights"].data[0] == 0.0
    assert isinstance(out.loss_fn_outputs[1]["logprobs"].data[0], float)
    trainer.max_batch_tokens = 6  # many micro-batches, reordered by length: same outputs, same order
    chunked = trainer.forward(data)
    assert chunked.loss == pytest.approx(out.loss, abs=1e-6)
    for i in range(len(data)):
        torch.testing.assert_close(
            torch.tensor(values(chunked, i)), torch.tensor(values(out, i)), equal_nan=True
        )


def test_gradient_accumulation_invariance(tiny_llama_path: Path) -> None:
    def run(batches: list[list[Datum]], budget: int) -> dict[str, torch.Tensor]:
        t = LoraTrainer(tiny_llama_path, dtype=torch.float64, max_batch_tokens=budget)
        t.init(4, seed=3)
        for _ in range(2):
            for batch in batches:
                t.forward_backward(batch)
            t.optim_step(ADAM.model_copy(update={"grad_clip_norm": 0.0}))
        return lora_weights(t)

    split = run([BATCH_A, BATCH_B], 4096)
    joined = run([BATCH_A + BATCH_B], 4096)
    chunked = run([BATCH_A + BATCH_B], 8)  # one datum per micro-batch
    for k, v in joined.items():
        torch.testing.assert_close(split[k], v, atol=1e-6, rtol=0)
        torch.testing.assert_close(chunked[k], v, atol=1e-6, rtol=0)


def test_skip_token_normalization_raw_sum_and_no_mixing(trainer: LoraTrainer) -> None:
    trainer.forward_backward(BATCH_A)
    trainer.optim_step(ADAM)
    d = datum([5, 6, 7, 8, 9], [0.5, -1.0, 0.0, 2.0])
    out = trainer.forward_backward([d], "cross_entropy", {"skip_token_normalization": True})
    assert out.metrics["skip_token_normalization"] == 1.0
    got = grads(trainer)
    # Reference: L = −Σ w·lp through the plain PEFT model, no normalisation.
    params = trainer.lora_parameters()
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    logits = trainer.model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[0].log_softmax(-1)
    lp = logits.gather(-1, torch.tensor([[6], [7], [8], [9]]))[:, 0]
    (-(lp * torch.tensor([0.5, -1.0, 0.0, 2.0])).sum()).backward()
    for g, p in zip(got, params, strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-5)
    for p, g in zip(params, saved, strict=True):
        p.grad = g
    with pytest.raises(BadRequest, match="cannot share an optimizer step"):
        trainer.forward_backward(BATCH_A)
    metrics = trainer.optim_step(ADAM).metrics
    assert metrics["step"] == 2.0
    trainer.forward_backward(BATCH_A)  # a new step may use the other mode
    with pytest.raises(BadRequest, match="cannot share an optimizer step"):
        trainer.forward_backward([d], "cross_entropy", {"skip_token_normalization": True})


def test_custom_loss_forward_returns_every_valid_logprob(trainer: LoraTrainer) -> None:
    d = datum([5, 6, 7, 8, 9], [0.0, 0.0, 0.0, 0.0])
    d.loss_fn_inputs["target_tokens"].data[2] = -100
    out = trainer.forward([d], "cross_entropy", {"skip_token_normalization": True})
    assert out.metrics["skip_token_normalization"] == 1.0
    lp = out.loss_fn_outputs[0]["logprobs"].data
    assert lp[2] is None and all(isinstance(v, float) and v < 0 for i, v in enumerate(lp) if i != 2)
    assert out.loss == 0.0


def test_forward_leaves_gradients_alone(trainer: LoraTrainer) -> None:
    trainer.forward_backward(BATCH_A)
    before = grads(trainer)
    trainer.forward(BATCH_B)
    trainer.forward(BATCH_B, "cross_entropy", {"skip_token_normalization": True})
    for a, b in zip(before, grads(trainer), strict=True):
        assert torch.equal(a, b)
    assert trainer.optim_step(ADAM).metrics["tokens"] == 8.0


def test_top_k_logprobs(trainer: LoraTrainer) -> None:
    out = trainer.forward(BATCH_A, top_k_logprobs=3)
    for i, d in enumerate(BATCH_A):
        n = len(d.loss_fn_inputs["target_tokens"].data)
        entry = out.loss_fn_outputs[i]
        assert entry["top_k_token_ids"].shape == [n, 3] and entry["top_k_token_ids"].dtype == "int64"
        assert entry["top_k_logprobs"].shape == [n, 3] and entry["top_k_logprobs"].dtype == "float32"
        ref = reference_logprobs(trainer, d)
        full = trainer.model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0]
        top = full.log_softmax(-1).topk(3).values.flatten()
        torch.testing.assert_close(
            torch.tensor(entry["top_k_logprobs"].data), top.detach(), atol=1e-5, rtol=0
        )
        assert len(ref) == n


def test_rl_loss_through_trainer(trainer: LoraTrainer) -> None:
    data = [
        datum([1, 2, 3, 4], logprobs=td([-4.0, -4.0, -4.0]), advantages=td([1.0]), mask=td([0.0, 1.0, 1.0])),
        datum([5, 6, 7], logprobs=td([-4.0, -4.0]), advantages=td([0.0])),
    ]
    out = trainer.forward_backward(data, "ppo")
    assert values(out, 1) == [0.0, 0.0]  # A = 0: inactive, 0.0 on the wire
    lp0 = values(out, 0)
    assert lp0[0] == 0.0 and lp0[1] < 0 and lp0[2] < 0
    ref = reference_logprobs(trainer, data[0])
    r = torch.exp(ref[1:] + 4.0)
    expected = float(-torch.minimum(r, r.clamp(0.8, 1.2)).sum()) / 2
    assert out.loss == pytest.approx(expected, rel=1e-5)
    assert trainer.optim_step(ADAM).metrics["tokens"] == 2.0


def test_dpo_through_trainer(trainer: LoraTrainer) -> None:
    chosen = datum([1, 2, 3, 4], [0.0, 1.0, 1.0], ref_logprobs=td([0.0, -4.5, -5.0]))
    rejected = datum([1, 2, 9, 10], [0.0, 1.0, 1.0], ref_logprobs=td([0.0, -4.0, -4.0]))
    out = trainer.forward_backward([chosen, rejected], "dpo", {"beta": 0.2})
    lc, lr = reference_logprobs(trainer, chosen), reference_logprobs(trainer, rejected)
    z = 0.2 * ((lc[1:].sum() + 9.5) - (lr[1:].sum() + 8.0))
    assert out.loss == pytest.approx(float(-torch.nn.functional.logsigmoid(z)), rel=1e-5)
    assert values(out, 0)[0] != values(out, 0)[0]  # weight 0: null
    with pytest.raises(BadRequest, match="even number"):
        trainer.forward([chosen], "dpo")


def test_save_and_load_state_with_optimizer_resumes_exactly(
    trainer: LoraTrainer, tiny_llama_path: Path, tmp_path: Path
) -> None:
    for _ in range(2):
        trainer.forward_backward(BATCH_A)
        trainer.optim_step(ADAM)
    trainer.save_state(tmp_path / "ckpt")
    loss_next = trainer.forward_backward(BATCH_B).loss
    trainer.optim_step(ADAM)
    expected = lora_weights(trainer)

    fresh = LoraTrainer(tiny_llama_path, dtype=torch.float32)
    fresh.init(16, seed=99)  # a different adapter: loading must replace it
    assert fresh.load_state(tmp_path / "ckpt", with_optimizer=True) == 2
    assert fresh.step == 2 and fresh.lora_rank == 8
    assert fresh.forward_backward(BATCH_B).loss == loss_next
    fresh.optim_step(ADAM)
    for k, v in expected.items():
        assert torch.equal(fresh.adapter_state_dict()[k], v), k

    assert fresh.load_state(tmp_path / "ckpt", with_optimizer=False) == 0
    assert fresh.step == 0


def test_load_state_errors_name_the_path(trainer: LoraTrainer, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        trainer.load_state(tmp_path / "nope", with_optimizer=True)
    trainer.save_state(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "trainer_state.json").write_text("{not json")
    with pytest.raises(ValueError, match=str(tmp_path / "ckpt")):
        trainer.load_state(tmp_path / "ckpt", with_optimizer=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_save_adapter_loads_with_peft(trainer: LoraTrainer, tiny_llama_path: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer.forward_backward(BATCH_A)
    trainer.optim_step(ADAM)
    trainer.save_adapter(tmp_path / "adapter")
    trainer.save_adapter(tmp_path / "adapter")  # overwriting is atomic too
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_llama_path), tmp_path / "adapter"
    )
    tokens = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=tokens).logits, trainer.model(input_ids=tokens).logits)
    cfg = trainer.lora_config_dict()
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 32 and "q_proj" in cfg["target_modules"]
    assert set(trainer.adapter_state_dict()) == {
        k.replace(".default", "") for k, _ in trainer.model.named_parameters() if "lora_" in k
    }


def test_reinit_with_new_rank_replaces_adapter(trainer: LoraTrainer) -> None:
    base_lp = trainer.forward(BATCH_A).loss
    trainer.forward_backward(BATCH_A)
    trainer.optim_step(ADAM)
    assert trainer.init(4) == InitTrainerServerResponse(step=0, lora_rank=4)
    assert trainer.lora_rank == 4 and trainer.step == 0
    names = [n for n, _ in trainer.model.named_parameters()]
    assert not any("base_model.model.base_model" in n for n in names)
    assert all(p.shape[0] == 4 for n, p in trainer.model.named_parameters() if "lora_A" in n)
    assert trainer.forward(BATCH_A).loss == pytest.approx(base_lp, abs=1e-6)  # fresh LoRA == base
    assert all(p.grad is None for p in trainer.lora_parameters())


def test_seed_determinism(tiny_llama_path: Path) -> None:
    a, b = LoraTrainer(tiny_llama_path), LoraTrainer(tiny_llama_path)
    a.init(4, seed=7)
    b.init(4, seed=7)
    for t in (a, b):
        t.forward_backward(BATCH_A)
        t.optim_step(ADAM)
    for k, v in lora_weights(a).items():
        assert torch.equal(v, b.adapter_state_dict()[k])


def test_failed_request_keeps_pending_gradients(trainer: LoraTrainer) -> None:
    trainer.forward_backward(BATCH_A)
    before = grads(trainer)
    good = datum([1, 2, 3, 4, 5], logprobs=td([-4.0] * 4), advantages=td([1.0]))
    bad = datum([1, 2, 3], logprobs=td([-1e30, -1e30]), advantages=td([1.0]))  # exp(lp − q) overflows
    trainer.max_batch_tokens = 4  # two micro-batches: the good one has already run backward when bad fails
    with pytest.raises(FloatingPointError, match="not finite"):
        trainer.forward_backward([good, bad], "importance_sampling")
    for a, b in zip(before, grads(trainer), strict=True):
        assert torch.equal(a, b)
    assert trainer.optim_step(ADAM).metrics["tokens"] == 8.0
