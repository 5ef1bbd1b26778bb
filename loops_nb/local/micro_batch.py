"""One micro-batch of a trainer request: a padded forward, the loss, and its backward when training.

Text rows are right-padded and run without an attention mask (a real token never sees the padding after
it), which keeps the fused attention kernel. Target logprobs are read only where the loss needs them: under
a plain LM head the decoder runs alone and the head runs in chunks over those positions (`lm_head`); a head
that is more than a linear layer, or image chunks (`vision`, with a mask when lengths differ), take the
whole model's logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from baseten.loops import TensorData

from loops_nb.local import lm_head
from loops_nb.local.datum_wire import ParsedDatum, tensor_data
from loops_nb.local.image_chunks import VisionInputs
from loops_nb.local.losses import LOSSES, LossBatch, collate, needed_positions, target_logprobs
from loops_nb.local.shared_prefix import PromptKey, prompt_key, shared_prefix_hidden

if TYPE_CHECKING:
    from transformers import PretrainedConfig

PLAIN_HEAD_TYPES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "smollm3",
    "phi3",
    "deepseek_v4",
    "gpt_oss",
    "gemma3_text",
}
"""Families whose logits are exactly `lm_head(last_hidden_state)`, so the head can run on selected rows
(tests/local/test_plain_heads.py checks each against the full model's logits)."""

TopK = tuple[torch.Tensor, torch.Tensor]
"""(logprobs, token ids) of the top-k tokens at each selected position."""


def has_plain_head(config: PretrainedConfig) -> bool:
    """Whether the head of a model with this config can run on selected positions alone."""
    scaled = any(
        getattr(config, a, None) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    return config.model_type in PLAIN_HEAD_TYPES and not scaled


@dataclass(frozen=True)
class MicroBatch:
    """What one micro-batch computes: its rows (datums of one request) and the request's loss."""

    rows: list[ParsedDatum]
    loss_fn: str
    loss_config: Mapping[str, Any]
    top_k: int
    backward: bool
    share_prefixes: bool = True
    """Run a prompt its rows share once (`shared_prefix`), with or without layers recomputed."""


@dataclass(frozen=True)
class MicroBatchResult:
    loss: torch.Tensor
    """The loss summed over the micro-batch (detached)."""
    count: int
    """What the loss is normalised by, later, over the whole optimizer step: active tokens (dpo: pairs)."""
    outputs: list[dict[str, TensorData]]
    """Each row's `loss_fn_outputs` entry (logprobs, and the top-k when asked), in row order."""
    computed_tokens: int = 0
    """Token positions the model ran: each shared prompt once (`shared_prefix`), none when nothing was needed."""
    total_tokens: int = 0
    """The rows' tokens: what an unshared forward runs."""


@dataclass(frozen=True)
class LogprobModel:
    """The adapted model as a micro-batch runs it: target logprobs at selected positions."""

    lm: Any
    """The PEFT model's base model (the LoRA layers are in it)."""
    device: torch.device
    dtype: torch.dtype
    """Of logprobs and losses: float64 for a float64 model, else float32."""
    plain_head: bool
    head_chunk: int
    """Positions per chunk of a plain head (`lm_head.head_chunk`)."""
    vision: VisionInputs | None

    def target_logprobs(
        self,
        batch: LossBatch,
        pos: tuple[torch.Tensor, ...],
        rows: list[ParsedDatum],
        top_k: int,
        share_prefixes: bool = False,
    ) -> tuple[torch.Tensor, TopK | None, int]:
        """Logprobs of `batch`'s targets at `pos`, their top-k when asked, and the token positions the model
        ran (fewer than the rows' tokens when rows shared a prompt)."""
        assert batch.tokens is not None and batch.target_tokens is not None and batch.real is not None
        tokens, targets = batch.tokens, batch.target_tokens[pos]
        total = sum(d.length for d in rows)
        chunks = [chunk for d in rows for chunk in d.images]
        if chunks and self.vision is not None:
            lengths = [d.length for d in rows]
            mask = None if min(lengths) == max(lengths) else batch.real.long()
            pixels = self.vision.pixels(chunks, "model_input image")
            extra = self.vision.inputs(tokens, mask, pixels)
            extra.pop("rope_deltas", None)
            logits = self.lm(attention_mask=mask, use_cache=False, **extra).logits[pos].to(self.dtype)
            return (*target_logprobs(logits, targets, top_k), total)
        if self.plain_head:
            decoder = self.lm.get_decoder()
            shared = None
            if share_prefixes and len(rows) > 1:
                need = torch.zeros_like(tokens, dtype=torch.bool)
                need[pos] = True
                shared = shared_prefix_hidden(decoder, tokens, need, [d.length for d in rows])
            if shared is not None:
                hidden, computed = shared.hidden, shared.computed_tokens
            else:
                hidden, computed = decoder(input_ids=tokens, use_cache=False).last_hidden_state, total
            head = self.lm.get_output_embeddings()
            picked, top = lm_head.target_logprobs(
                hidden[pos], head, targets, chunk=self.head_chunk, dtype=self.dtype, top_k=top_k
            )
            return picked, top, computed
        logits = self.lm(input_ids=tokens, use_cache=False).logits[pos].to(self.dtype)
        return (*target_logprobs(logits, targets, top_k), total)


def prompt_keys(rows: Sequence[ParsedDatum], loss_fn: str, top_k: int) -> list[PromptKey]:
    """Each datum's prompt as the shared forward will group it (`shared_prefix.prompt_key`), for the planner
    to keep a prompt's rows in one micro-batch. Each is collated alone: a row's needed positions do not
    depend on the rows padded beside it."""
    keys = []
    for datum in rows:
        batch = collate([datum], torch.device("cpu"), torch.float32)
        assert batch.tokens is not None
        keys.append(prompt_key(batch.tokens[0], needed_positions(batch, loss_fn, top_k)[0]))
    return keys


def run_micro_batch(model: LogprobModel, job: MicroBatch) -> MicroBatchResult:
    """One padded forward (+ backward, which accumulates into the parameters' `.grad`) over `job.rows`."""
    rows = job.rows
    batch = collate(rows, model.device, model.dtype)
    need = needed_positions(batch, job.loss_fn, job.top_k)
    pos = need.nonzero(as_tuple=True)
    top: TopK | None = None
    computed = 0
    if pos[0].numel():  # else nothing to compute (e.g. all advantages 0): skip the model entirely
        picked, top, computed = model.target_logprobs(batch, pos, rows, job.top_k, job.share_prefixes)
        batch.lp = batch.lp.index_put(pos, picked)
    out = LOSSES[job.loss_fn](batch, job.loss_config)
    if not bool(torch.isfinite(out.loss)):
        raise FloatingPointError(
            f"{job.loss_fn} loss is not finite ({float(out.loss.detach())}); check the inputs"
        )
    if job.backward and out.loss.requires_grad:
        out.loss.backward()
    return MicroBatchResult(
        out.loss.detach(),
        out.count,
        _row_outputs(out.logprobs, top, rows),
        computed,
        sum(d.length for d in rows),
    )


def _row_outputs(
    logprobs: torch.Tensor, top: TopK | None, rows: list[ParsedDatum]
) -> list[dict[str, TensorData]]:
    lengths = [d.length for d in rows]
    lp_cpu = logprobs.float().cpu()
    top_cpu = (top[0].float().cpu(), top[1].cpu()) if top is not None else None
    outputs = []
    for j, n in enumerate(lengths):
        entry: dict[str, TensorData] = {"logprobs": tensor_data(lp_cpu[j, :n])}
        if top_cpu is not None:  # every real position was selected, so row j's are a contiguous run
            start = sum(lengths[:j])
            entry["top_k_token_ids"] = tensor_data(top_cpu[1][start : start + n])
            entry["top_k_logprobs"] = tensor_data(top_cpu[0][start : start + n])
        outputs.append(entry)
    return outputs
