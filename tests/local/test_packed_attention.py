"""`packed_attention` against SDPA under the packed group's 4D mask (its twin): outputs and gradients of
queries, keys and values agree within float rounding, for grouped-query heads and rows of unequal length."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from loops_nb.local import packed_attention
from loops_nb.local.packed_attention import PackedRows


def packed_mask(shared: int, spans: list[int]) -> torch.Tensor:
    """The mask `shared_prefix.packed_hidden` builds: a row's token sees the prompt and its own earlier tokens."""
    segment = torch.cat([torch.full((shared,), -1)] + [torch.full((n,), i) for i, n in enumerate(spans)])
    size = segment.shape[0]
    allowed = torch.ones(size, size, dtype=torch.bool).tril()
    allowed &= (segment[None, :] == -1) | (segment[None, :] == segment[:, None])
    return torch.zeros(size, size).masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]


class Attention(torch.nn.Module):
    """What the attention functions read of a decoder layer's attention module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def twin(
    heads: int, kv_heads: int, shared: int, spans: list[int], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """(output and gradients of packed_attention, the same of SDPA with the mask, rows_attention calls)."""
    torch.manual_seed(0)
    size, dim = shared + sum(spans), 8
    inputs = [
        torch.randn(1, heads, size, dim, requires_grad=True),
        torch.randn(1, kv_heads, size, dim, requires_grad=True),
        torch.randn(1, kv_heads, size, dim, requires_grad=True),
    ]
    module, mask = Attention(heads // kv_heads), packed_mask(shared, spans)
    calls: list[int] = []
    rows_attention = packed_attention.rows_attention
    monkeypatch.setattr(packed_attention, "rows_attention", lambda *a: calls.append(1) or rows_attention(*a))
    rows = PackedRows.of(shared, spans, torch.device("cpu"))
    results = []
    for attend in (
        lambda: packed_attention.packed_attention(module, *inputs, mask, scaling=0.3, packed_rows=rows)[0],
        lambda: sdpa_attention_forward(module, *inputs, mask, scaling=0.3)[0],
    ):
        out = attend()
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        results.append([out.detach(), *torch.autograd.grad((out * weights).sum(), inputs)])
    return results[0], results[1], calls


def test_many_short_rows_attend_as_under_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs, calls = twin(2, 1, 12, [3, 1, 4, 2, 5, 2, 1, 3], monkeypatch)
    assert calls == [1], "the rows' attention ran instead of SDPA"
    for a, b in zip(mine, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())


def test_scores_larger_than_the_mask_are_left_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two long rows under many heads: the padded scores would outgrow the mask, so SDPA runs (same result)."""
    mine, theirs, calls = twin(8, 2, 4, [9, 7], monkeypatch)
    assert calls == []
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)


def test_a_layout_knows_each_tokens_row_and_place() -> None:
    rows = PackedRows.of(5, [2, 3, 1], torch.device("cpu"))
    assert rows.tokens == 6
    assert rows.row_of.tolist() == [0, 0, 1, 1, 1, 2]
    assert rows.pos_of.tolist() == [0, 1, 0, 1, 2, 0]
    assert rows.index.tolist() == [[0, 1, 0], [2, 3, 4], [5, 0, 0]]
    assert rows.visible[0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
