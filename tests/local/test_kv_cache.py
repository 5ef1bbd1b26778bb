"""The sampler's in-place KV cache: the same logits as transformers' concatenating `DynamicCache`, through a
prefill, decode steps past the headroom, and a row drop (the decode batch assigns new tensors then), with
far fewer buffer allocations than steps."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from sampler_fixtures import sampler_model_path_fixture  # noqa: F401 - registers the fixture
from transformers import AutoModelForCausalLM, DynamicCache

from loops_nb.local import kv_cache
from loops_nb.local.kv_cache import GrowingLayer, growing_cache, is_full_attention
from loops_nb.local.sampler import SamplerEngine
from loops_nb.local.sampling_types import SampleRequest

STEPS = kv_cache.HEADROOM + 10  # crosses one reallocation


def decode(model, cache: DynamicCache) -> list[torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (4, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # one left-padded row, as the decode batch builds them
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = [model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache).logits]
    position = positions[:, -1:] + 1
    for step in range(STEPS):
        if step == 20:  # a finished row leaves the batch
            keep = torch.tensor([0, 2, 3])
            cache.batch_select_indices(keep)
            ids, mask, position = ids[keep], mask[keep], position[keep]
        mask = F.pad(mask, (0, 1), value=1)
        token = ids[:, step % 7 : step % 7 + 1]
        out = model(input_ids=token, attention_mask=mask, position_ids=position, cache=cache)
        logits.append(out.logits)
        position = position + 1
    return logits


def test_growing_cache_matches_dynamic_cache(tiny_llama_path: Path, monkeypatch) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    allocations = 0
    reallocate = GrowingLayer._reallocate

    def counting(self, *args, **kwargs):
        nonlocal allocations
        allocations += 1
        return reallocate(self, *args, **kwargs)

    monkeypatch.setattr(GrowingLayer, "_reallocate", counting)
    with torch.inference_mode():
        plain = decode(model, DynamicCache(config=model.config))
        cache = growing_cache(model.config)
        assert all(isinstance(layer, GrowingLayer) for layer in cache.layers) and all(
            is_full_attention(layer) for layer in cache.layers
        )
        grown = decode(model, cache)
    for a, b in zip(plain, grown, strict=True):
        assert torch.equal(a, b)
    layers = len(cache.layers)
    # Per layer: the prefill, the row drop, and the headroom running out once: not one per step.
    assert allocations <= 3 * layers < STEPS * layers
    assert cache.get_seq_length() == 7 + STEPS


def test_only_full_attention_layers_grow() -> None:
    from transformers.cache_utils import DynamicSlidingWindowLayer

    assert is_full_attention(GrowingLayer())
    assert not is_full_attention(DynamicSlidingWindowLayer(sliding_window=4))


def test_a_decode_batch_never_makes_room_past_what_its_rows_can_feed_back(
    sampler_model_path: Path, monkeypatch
) -> None:
    """A 10-token prompt with at most 4 new tokens fills 13 cache positions (the last token is never fed
    back): every buffer the sampler allocates has room for at most that, not `HEADROOM` more."""
    capacities: list[int] = []
    reallocate = GrowingLayer._reallocate

    def recording(self, key_states, value_states, length, capacity):
        capacities.append(capacity)
        return reallocate(self, key_states, value_states, length, capacity)

    monkeypatch.setattr(GrowingLayer, "_reallocate", recording)
    request = SampleRequest(prompt=list(range(3, 13)), n=3, temperature=1.0, max_tokens=4, seed=0)
    with SamplerEngine(sampler_model_path, device="cpu", dtype=torch.float32, prefix_cache_mb=0) as engine:
        choices = engine.sample(request).choices
    assert capacities and max(capacities) <= 10 + 4 - 1 < 10 + kv_cache.HEADROOM
    assert all(len(choice.token_ids) <= 4 for choice in choices)
