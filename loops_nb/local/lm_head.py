"""Target logprobs through the LM head without materialising full-vocabulary logits for every position.

A 49k-token vocabulary makes the logits of one position 200 KB in fp32; a plain `log_softmax` over a
batch of 4k positions keeps 800 MB for autograd and as much again for its gradient, more than the model.
`target_logprobs` instead runs the head over `chunk` positions at a time: the forward keeps only each
position's log-sum-exp, and the backward recomputes one chunk's logits to form `softmax - onehot` there.
The memory no longer grows with the number of positions. When all positions fit one chunk (the usual
micro-batch), the softmax is kept instead, as a fused cross-entropy does, so no head matmul is repeated.

The head weights are frozen (LoRA never targets the output head here), so only the hidden states get a
gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ROW_BYTES_FACTOR = 3
"""Logit-sized buffers a chunk holds at once (logits, their exp and the gradient), for sizing chunks."""


def head_chunk(budget_bytes: int, vocab: int, element_bytes: int = 4) -> int:
    """Positions per chunk so that one chunk's logit buffers fit `budget_bytes` (at least 16)."""
    return max(16, budget_bytes // max(1, vocab * element_bytes * ROW_BYTES_FACTOR))


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
    def forward(  # type: ignore[override]
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
        ctx.chunk, ctx.dtype, ctx.shape = chunk, dtype, targets.shape
        if rows <= chunk:  # one chunk: keep its softmax for the backward instead of recomputing the head
            with torch.no_grad():
                logits = _chunk_logits(hidden, weight, bias, dtype)
                lse = logits.logsumexp(-1, keepdim=True)
                picked = logits.gather(-1, flat) - lse
                probs = logits.sub_(lse).exp_()
            ctx.save_for_backward(hidden, weight, bias, flat, probs)
            ctx.kept = True
            return picked.reshape(targets.shape)
        ctx.kept = False
        picked = torch.empty(flat.shape, dtype=dtype, device=hidden.device)
        lse = torch.empty(rows, dtype=dtype, device=hidden.device)
        with torch.no_grad():
            for start in range(0, rows, chunk):
                end = min(rows, start + chunk)
                logits = _chunk_logits(hidden[start:end], weight, bias, dtype)
                lse[start:end] = logits.logsumexp(-1)
                picked[start:end] = logits.gather(-1, flat[start:end]) - lse[start:end, None]
                del logits
        ctx.save_for_backward(hidden, weight, bias, flat, lse)
        return picked.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, flat, saved = ctx.saved_tensors
        grad = grad.reshape(flat.shape).to(ctx.dtype)
        if ctx.kept:  # `saved` is the softmax of the one chunk
            dlogits = saved.mul_(-grad.sum(-1, keepdim=True)).scatter_add_(-1, flat, grad)
            return (dlogits.to(weight.dtype) @ weight).to(hidden.dtype), None, None, None, None, None
        lse = saved
        grad_hidden = torch.empty_like(hidden)
        for start in range(0, flat.shape[0], ctx.chunk):
            end = min(flat.shape[0], start + ctx.chunk)
            g = grad[start:end]
            # d lp_k / d logits = onehot(t_k) - softmax, summed over a row's K targets with their weights.
            dlogits = _chunk_logits(hidden[start:end], weight, bias, ctx.dtype)
            dlogits.sub_(lse[start:end, None]).exp_().mul_(-g.sum(-1, keepdim=True))
            dlogits.scatter_add_(-1, flat[start:end], g)
            grad_hidden[start:end] = (dlogits.to(weight.dtype) @ weight).to(hidden.dtype)
            del dlogits
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
