"""Target logprobs through the LM head without materialising full-vocabulary logits for every position.

`target_logprobs` runs the head over `chunk` positions at a time and, when a gradient is needed, forms each
position's expected output embedding (`softmax @ W`) while the chunk's logits exist, as fused linear
cross-entropy kernels do. The gradient of a target's logprob with respect to the hidden state is
`W[target] - softmax @ W`, so the backward is a gather and a product and keeps one hidden-sized vector a
position, not a logit row. The head weights are frozen (LoRA never targets the head here).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ROW_BYTES_FACTOR = 3
"""Logit-sized buffers a chunk holds at once (logits, their exp and the gradient), for sizing chunks."""


def head_chunk(budget_bytes: int, vocab: int) -> int:
    """Positions per chunk so that one chunk's float32 logit buffers fit `budget_bytes` (at least 16)."""
    return max(16, budget_bytes // max(1, vocab * 4 * ROW_BYTES_FACTOR))


def target_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    chunk: int,
    dtype: torch.dtype = torch.float32,
    top_k: int = 0,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Logprobs [M] or [M, K] of `targets` under `head(hidden)` ([M, H] -> [M, V]), and top-k if asked.

    -100 targets read id 0; callers mask those positions. Differentiable with respect to `hidden`.
    """
    weight: torch.Tensor = head.weight  # type: ignore[assignment]
    bias: torch.Tensor | None = getattr(head, "bias", None)
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("the chunked LM head needs frozen head weights (LoRA on lm_head is not supported)")
    safe = targets.clamp_min(0)
    picked = _ChunkedTargetLogprobs.apply(hidden, weight, bias, safe, chunk, dtype)
    top = _top_k(hidden.detach(), weight, bias, top_k, chunk, dtype) if top_k else None
    return picked, top


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    return F.linear(hidden, weight, bias).to(dtype)


class _ChunkedTargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        rows = targets.shape[0]
        flat = targets.reshape(rows, -1)
        ctx.dtype = dtype
        picked = torch.empty(flat.shape, dtype=dtype, device=hidden.device)
        # d lp_k / d hidden = W[t_k] - softmax @ W: the second term, formed here while a chunk's logits
        # exist, is all the backward needs, so it never runs the head again.
        expected = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        with torch.no_grad():
            for start in range(0, rows, chunk):
                end = min(rows, start + chunk)
                logits = _chunk_logits(hidden[start:end], weight, bias, dtype)
                lse = logits.logsumexp(-1, keepdim=True)
                picked[start:end] = logits.gather(-1, flat[start:end]) - lse
                if expected is not None:
                    probs = logits.sub_(lse).exp_()
                    expected[start:end] = (probs.to(weight.dtype) @ weight).to(hidden.dtype)
                del logits
        ctx.save_for_backward(weight, flat, expected)
        return picked.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        weight, flat, expected = ctx.saved_tensors
        grad = grad.reshape(flat.shape).to(ctx.dtype)
        # Summed over a row's K targets with their weights: sum_k g_k W[t_k] - (sum_k g_k) softmax @ W.
        chosen = torch.einsum("mk,mkh->mh", grad.to(weight.dtype), weight[flat])
        grad_hidden = chosen.to(expected.dtype) - grad.sum(-1, keepdim=True).to(expected.dtype) * expected
        return grad_hidden, None, None, None, None, None


def _top_k(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    chunk: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    values, ids = [], []
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk):
            logp = _chunk_logits(hidden[start : start + chunk], weight, bias, dtype).log_softmax(-1)
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            values.append(top.values)
            ids.append(top.indices)
    return torch.cat(values), torch.cat(ids)
