"""The embedded Loops' memory is bounded by design: micro-batches by a budget, one base per model, the
chunked LM head, over-long datums refused before anything is allocated, idle runs parked to disk."""

from __future__ import annotations

import dataclasses
import gc
import math
from pathlib import Path

import httpx
import pytest
import torch
from baseten.loops import AdamParams, Datum, ModelInput, TensorData

from loops_nb.local import model_store
from loops_nb.local.lm_head import target_logprobs
from loops_nb.local.memory_budget import MIB, PeakMemoryEstimate, check_lines
from loops_nb.local.shared_base import BASE_MODELS
from loops_nb.local.trainer import LoraTrainer


def wire_datum(seq: list[int]) -> dict:
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": seq[:-1]}]},
        "loss_fn_inputs": {"target_tokens": {"data": seq[1:], "dtype": "int64", "shape": [len(seq) - 1]}},
    }


def sdk_datum(seq: list[int]) -> Datum:
    return Datum(
        model_input=ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": TensorData(data=seq[1:], dtype="int64", shape=[len(seq) - 1])},
    )


def rows(count: int, length: int, seed: int = 0) -> list[Datum]:
    g = torch.Generator().manual_seed(seed)
    return [sdk_datum(r) for r in torch.randint(1, 127, (count, length + 1), generator=g).tolist()]


class SavedBytes:
    """The most bytes autograd held for one micro-batch's backward, over a request (a peak, not a sum)."""

    def __init__(self, trainer: LoraTrainer) -> None:
        self.peak = 0
        self.batches = 0
        weights = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
        original = trainer._micro_batch

        def counted(*args, **kwargs):
            seen: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                if t.untyped_storage().data_ptr() not in weights:
                    seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                result = original(*args, **kwargs)
            self.peak = max(self.peak, sum(seen.values()))
            self.batches += 1
            return result

        trainer._micro_batch = counted  # type: ignore[method-assign]


def test_a_requests_activation_memory_is_bounded_by_the_budget_not_its_size(tiny_llama_path: Path) -> None:
    trainer = LoraTrainer(tiny_llama_path, memory_budget_mb=1)
    trainer.init(4, seed=0)
    peaks = {}
    for scale in (1, 8):
        probe = SavedBytes(trainer)
        trainer.forward_backward(rows(16 * scale, 60))
        peaks[scale] = (probe.peak, probe.batches)
    budget = trainer.memory_budget
    assert peaks[8][1] > peaks[1][1] > 1  # more data means more micro-batches, not bigger ones
    assert peaks[8][0] <= 1.25 * budget and peaks[1][0] <= 1.25 * budget  # the head's chunk comes on top
    assert peaks[8][0] <= 1.1 * peaks[1][0]
    # The same request with no budget to speak of is one micro-batch holding all of it.
    unbounded = LoraTrainer(tiny_llama_path, memory_budget_mb=100_000)
    unbounded.init(4, seed=0)
    probe = SavedBytes(unbounded)
    unbounded.forward_backward(rows(128, 60))
    assert probe.batches == 1 and probe.peak > 4 * peaks[8][0]


def test_micro_batching_and_recomputation_change_no_number(tiny_llama_path: Path) -> None:
    """Small budgets (many micro-batches; a sequence too long for the budget recomputes its layers) give
    the loss, logprobs and gradients of one big batch."""
    data = rows(6, 40) + rows(1, 200, seed=1)
    results = []
    for budget in (100_000, 1):
        t = LoraTrainer(tiny_llama_path, dtype=torch.float64, memory_budget_mb=budget)
        t.init(4, seed=0)
        t.max_batch_tokens = 10**9
        if budget == 1:
            t._cost = dataclasses.replace(t.activation_cost(), checkpointed=1)
            t.memory_budget = 150 * t._cost.full  # 200 tokens do not fit without recomputation
            plan = t.plan(t._parsed(data, "cross_entropy"), "cross_entropy", backward=True)
            assert any(recompute for _, recompute in plan) and len(plan) > 2
        out = t.forward_backward(data)
        grads = [p.grad.clone() for p in t.lora_parameters()]
        results.append((out, grads))
    (a, ga), (b, gb) = results
    assert a.loss == pytest.approx(b.loss, rel=1e-12)
    for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
        assert torch.allclose(torch.tensor(x["logprobs"].data), torch.tensor(y["logprobs"].data), atol=1e-10)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-10)


@pytest.mark.parametrize("chunk", [37, 1000])
@pytest.mark.parametrize("shape", [(300,), (300, 3)])
def test_the_chunked_head_equals_a_full_log_softmax(
    shape: tuple[int, ...], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loops_nb.local import lm_head

    heads_run: list[int] = []
    chunk_logits = lm_head._chunk_logits
    monkeypatch.setattr(lm_head, "_chunk_logits", lambda *a: heads_run.append(1) or chunk_logits(*a))
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 500, bias=True, dtype=torch.float64).requires_grad_(False)
    hidden = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    targets, weights = torch.randint(0, 500, shape), torch.randn(shape, dtype=torch.float64)
    picked, top = target_logprobs(hidden, head, targets, chunk=chunk, dtype=torch.float64, top_k=3)
    heads_run.clear()
    (picked * weights).sum().backward()
    assert not heads_run, "the backward runs no head: the forward formed softmax @ W"
    ours = hidden.grad.clone()
    hidden.grad = None
    logp = head(hidden).log_softmax(-1)
    reference = logp.gather(-1, targets.reshape(300, -1)).reshape(shape)
    (reference * weights).sum().backward()
    assert torch.allclose(picked, reference, atol=1e-12) and torch.allclose(ours, hidden.grad, atol=1e-12)
    assert top is not None and torch.equal(top[1], logp.topk(3).indices)


def test_trainer_and_sampler_share_one_base(embedded_loops, tiny_chat_model) -> None:
    svc = embedded_loops.service_client()
    clients = [svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4) for _ in range(2)]
    sampler = embedded_loops.state.sampler(str(tiny_chat_model))
    trainers = [r.trainer for r in embedded_loops.state.runs.values() if r.trainer is not None]

    def storages(module) -> set[int]:
        return {p.untyped_storage().data_ptr() for n, p in module.named_parameters() if "lora_" not in n}

    base = storages(sampler.model)
    assert len(trainers) >= 2 and all(storages(t.model) == base for t in trainers)
    for tc in clients:
        tc.close()


def test_an_over_long_datum_is_refused_and_the_server_serves_the_next_request(
    embedded_loops, tiny_chat_model
) -> None:
    svc = embedded_loops.service_client()
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, max_seq_len=32)
    with pytest.raises(httpx.HTTPStatusError) as info:  # the SDK: over the run's max_seq_len
        tc.forward_backward([sdk_datum(list(range(3, 44)))], loss_fn="cross_entropy").result()
    assert info.value.response.status_code == 422
    assert "data[0].model_input: 40 tokens exceed this run's limit of 32" in str(info.value)
    run_id = next(r.id for r in embedded_loops.state.runs.values() if r.max_seq_len == 32)
    headers = {"Authorization": f"Api-Key {embedded_loops.api_key}"}
    over_context = {
        "data": [wire_datum([5] * 514)],
        "loss_fn": "cross_entropy",
    }  # the model has 512 positions
    raw = httpx.post(f"{embedded_loops.url}/trainers/{run_id}/forward", json=over_context, headers=headers)
    assert raw.status_code == 422 and "513 tokens exceed this run's limit of 32" in raw.json()["detail"]
    fb = tc.forward_backward([sdk_datum(list(range(3, 30)))], loss_fn="cross_entropy").result()
    assert math.isfinite(fb.loss)
    tc.close()
    wide = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4)
    wide_id = next(
        r.id for r in embedded_loops.state.runs.values() if r.trainer and r.id != run_id and r.active
    )
    raw = httpx.post(f"{embedded_loops.url}/trainers/{wide_id}/forward", json=over_context, headers=headers)
    assert raw.status_code == 422 and "limit of 512" in raw.json()["detail"]
    wide.close()


def test_an_idle_run_is_parked_to_disk_and_comes_back_unchanged(tmp_path, model_cache_dir, tiny_chat_model):
    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(
        state_dir=tmp_path, cache_dir=model_cache_dir, device="cpu", idle_run_seconds=3600
    ) as loops:
        tc = loops.service_client().create_lora_training_client(base_model=str(tiny_chat_model), rank=4)
        data = [sdk_datum(list(range(3, 30)))]
        tc.forward_backward(data, loss_fn="cross_entropy").result()
        tc.optim_step(AdamParams(learning_rate=1e-2)).result()
        (run,) = loops.state.runs.values()
        weights = {k: v.clone() for k, v in run.trainer.adapter_state_dict().items()}
        moments = [s["exp_avg"].clone() for s in run.trainer._optimizer.state.values()]
        assert loops.state.reaper is not None
        assert loops.state.reaper.sweep() == []  # not idle for an hour yet
        loops.state.reaper.idle_seconds = 0
        assert loops.state.reaper.sweep() == [run.id]
        assert run.trainer is None and run.parked_step == 1
        back = tc.forward(data, loss_fn="cross_entropy").result()  # the next op brings it back
        assert math.isfinite(back.loss) and run.trainer is not None and run.trainer.step == 1
        assert all(torch.equal(weights[k], v) for k, v in run.trainer.adapter_state_dict().items())
        restored = [s["exp_avg"] for s in run.trainer._optimizer.state.values()]
        assert all(torch.equal(a, b) for a, b in zip(moments, restored, strict=True))
        assert tc.optim_step(AdamParams(learning_rate=1e-2)).result().metrics["step"] == 2
        tc.close()


def test_structural_copies_share_tensors_and_free_with_their_users(tiny_llama_path: Path) -> None:
    import gc

    gc.collect()  # trainers of earlier tests let go of their bases
    before = BASE_MODELS.loaded()
    a = BASE_MODELS.instance(tiny_llama_path, torch.device("cpu"), torch.float64)
    b = BASE_MODELS.instance(tiny_llama_path, torch.device("cpu"), torch.float64)
    assert a is not b and a.model.layers[0] is not b.model.layers[0]
    assert a.lm_head.weight is b.lm_head.weight and BASE_MODELS.loaded() == before + 1
    del a, b
    gc.collect()
    assert BASE_MODELS.loaded() == before


def test_dtype_auto_is_float32_on_any_cpu_and_bf16_is_opt_in(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if torch.cuda.is_available():
        pytest.skip("auto picks CUDA here")
    # Even a CPU that multiplies bf16 in hardware gets float32: bf16 learned worse there (docs/benchmarks.md).
    for fast in (True, False):
        monkeypatch.setattr(model_store, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert model_store.device_and_dtype("cpu") == (torch.device("cpu"), torch.float32)
        assert model_store.device_and_dtype("auto")[1] == torch.float32
        caplog.clear()
        assert model_store.device_and_dtype("cpu", "bfloat16")[1] == torch.bfloat16
        emulated = [r for r in caplog.records if "bf16 is emulated" in r.getMessage()]
        assert bool(emulated) is not fast
    with pytest.raises(model_store.UserError, match="Unknown dtype"):
        model_store.device_and_dtype("cpu", "int4")


def test_check_estimates_peak_memory_and_warns_past_what_is_available(monkeypatch, tiny_chat_model) -> None:
    from loops_nb.config.sections import ComputeConfig, ModelConfig
    from loops_nb.local import memory_budget

    monkeypatch.delenv("LOOPS_BASE_URL", raising=False)
    model = ModelConfig(base_model=str(tiny_chat_model), lora_rank=8, max_seq_len=256)
    lines, warnings = check_lines(ComputeConfig(), model, concurrent_sequences=64)
    assert len(lines) == 1 and lines[0].startswith("memory: about") and not warnings
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 100 * MIB)
    lines, warnings = check_lines(ComputeConfig(), model, concurrent_sequences=64)
    assert len(warnings) == 1 and "memory_budget_mb" in warnings[0]
    assert check_lines(ComputeConfig(scope="serverless"), model, concurrent_sequences=64) == ([], [])
    estimate = PeakMemoryEstimate(runtime=1, weights=2, adapter=3, activations=4, kv_cache=5, available=99)
    assert estimate.total == 15


def _live_tensor_bytes() -> int:
    gc.collect()
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in gc.get_objects()
        if isinstance(t, torch.Tensor) and t.device.type == "cpu"
    }
    return sum(storages.values())


@pytest.mark.slow
def test_the_activation_probe_keeps_nothing_alive(tiny_llama_path: Path) -> None:
    trainer = LoraTrainer(tiny_llama_path)
    trainer.init(4, seed=0)
    before = _live_tensor_bytes()
    cost = trainer.activation_cost()
    assert cost.full > cost.checkpointed > 0
    # Each trainer on `loops serve` measures once; what the probe's forward saved must go with it.
    leaked = _live_tensor_bytes() - before
    assert leaked < cost.full * 8, (leaked, cost.full)  # the probe saved cost.full x 64 bytes
