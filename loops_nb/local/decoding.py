"""Token selection and prompt scoring for the local sampler, vectorised across the rows of a decode batch.

Every row carries its own temperature, top-k, top-p and random stream, and a row's draw must not depend on
which other rows share its batch (a seeded request gives the same completion alone or coalesced with
others). So randomness is not drawn per step from a shared generator: each row gets, when it joins a batch,
a row of uniforms from its request's own `torch.Generator` (one number per token it may generate), and picks
its token by inverse-CDF sampling with the uniform for its current step. (The logits themselves can differ in
the last bits with the batch's padding, so this is reproducible up to float ties, as in vLLM.) Rows are split by the work they need,
each group processed in one tensor op, and which group a row falls in depends only on its own parameters:

* greedy rows (temperature ~0): argmax of the raw logits, as `model.generate(do_sample=False)` does;
* plain rows (no top-k/top-p): inverse CDF over the vocabulary in token order;
* truncated rows: a stable descending sort, the top-k then top-p (over the top-k-renormalised mass, as
  vLLM does) masks, then inverse CDF in sorted order.

The logprob returned for a sampled token is the model's own, `log_softmax(logits)` at that token, whatever
the temperature, top-k or top-p it was drawn with, as Loops returns it (docs/reference/local_loops.md,
"Logprobs: what Loops returns, and the evidence"): it equals the trainer's logprob of the token at any
temperature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from loops_nb.local.sampling_types import PromptLogprobEntry, SampleRequest

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
GREEDY_EPS = 1e-5


@dataclass
class RowParams:
    """Per-row sampling parameters of a decode batch, on the batch's device.

    `uniforms[i, s]` is row i's random number for its s-th generated token and `step[i]` how many tokens it
    has generated; `kinds` is a python list so choosing the code path costs no device sync.
    """

    temperature: Tensor  # [B] float32; 0 for greedy rows
    top_k: Tensor  # [B] long; 0 = off
    top_p: Tensor  # [B] float32; 1 = off
    uniforms: Tensor  # [B, T] float32 in [0, 1)
    step: Tensor  # [B] long
    kinds: list[str]
    """Each row's path: "greedy", "plain" or "truncated" (see the module's notes)."""

    @classmethod
    def build(cls, requests: Sequence[SampleRequest], uniforms: Tensor, device: torch.device) -> RowParams:
        """The parameters of rows asking for `requests` (one per row), drawing on `uniforms`."""
        temperature = [r.temperature if r.temperature >= GREEDY_EPS else 0.0 for r in requests]
        top_k = [r.top_k or 0 for r in requests]
        return cls(
            temperature=torch.tensor(temperature, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            top_p=torch.tensor([r.top_p for r in requests], dtype=torch.float32, device=device),
            uniforms=uniforms.to(device=device, dtype=torch.float32),
            step=torch.zeros(len(requests), dtype=torch.long, device=device),
            kinds=[
                "greedy" if t == 0.0 else "truncated" if k > 0 or r.top_p < 1.0 else "plain"
                for t, k, r in zip(temperature, top_k, requests, strict=True)
            ],
        )

    def rows(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]

    def tensors(self) -> tuple[Tensor, ...]:
        return self.temperature, self.top_k, self.top_p, self.uniforms, self.step

    def select(self, keep: list[int]) -> RowParams:
        """The parameters of rows `keep` (in that order), for when finished rows leave the batch."""
        index = torch.tensor(keep, dtype=torch.long, device=self.step.device)
        t, k, p, u, s = (x[index] for x in self.tensors())
        return RowParams(t, k, p, u, s, [self.kinds[r] for r in keep])

    def concat(self, other: RowParams) -> RowParams:
        """These rows followed by `other`'s (rows joining a running batch)."""
        width = max(self.uniforms.shape[1], other.uniforms.shape[1])
        a, b = (
            replace(p, uniforms=F.pad(p.uniforms, (0, width - p.uniforms.shape[1]))) for p in (self, other)
        )
        t, k, p, u, s = (torch.cat([x, y]) for x, y in zip(a.tensors(), b.tensors(), strict=True))
        return RowParams(t, k, p, u, s, a.kinds + b.kinds)


def _invert_cdf(cdf: Tensor, u: Tensor) -> Tensor:
    """Index of the first entry of each row's (unnormalised) CDF above `u * total`.

    The target is kept strictly below the total so that rounding can never select a zero-mass tail entry.
    """
    total = cdf[:, -1:]
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


def _sample_truncated(probs: Tensor, top_k: Tensor, top_p: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling after top-k then top-p truncation, in a stable descending order."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(probs.shape[1], device=probs.device)[None, :]
    k = torch.where(top_k > 0, top_k, probs.shape[1])
    kept = sorted_probs * (ranks < k[:, None])
    cumulative = kept.cumsum(dim=-1)
    # Keep a token while the mass before it is under p of the top-k mass: the smallest set reaching p.
    before = cumulative - kept
    kept = kept * (before < top_p[:, None] * cumulative[:, -1:])
    position = _invert_cdf(kept.cumsum(dim=-1), u)
    return order.gather(1, position[:, None]).squeeze(1)


def select_tokens(logits: Tensor, params: RowParams) -> tuple[Tensor, Tensor]:
    """Pick each row's next token and its logprob. `logits` is `[B, V]`; returns `([B] long, [B] float32)`."""
    logits = logits.float()
    rows = logits.shape[0]
    greedy, plain, truncated = (params.rows(kind) for kind in ("greedy", "plain", "truncated"))
    if not plain and not truncated:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)
    scale = torch.where(params.temperature > 0, params.temperature, 1.0)
    tempered = torch.log_softmax(logits / scale[:, None], dim=-1)  # what the token is drawn from
    tokens = torch.zeros(rows, dtype=torch.long, device=logits.device)
    u = params.uniforms.gather(1, params.step.clamp(max=params.uniforms.shape[1] - 1)[:, None]).squeeze(1)
    if greedy:
        index = torch.tensor(greedy, device=logits.device)
        tokens[index] = logits[index].argmax(dim=-1)
    if len(plain) == rows:
        # Every row samples plainly (a GRPO batch): no other path reads `tempered`, so its CDF is built in
        # place. Each [B, V] temporary is a fresh mapping the kernel faults in (`allocator`), every token.
        tokens = _invert_cdf(tempered.exp_().cumsum_(dim=-1), u)
    elif plain:
        index = torch.tensor(plain, device=logits.device)
        tokens[index] = _invert_cdf(tempered[index].exp().cumsum(dim=-1), u[index])
    if truncated:
        index = torch.tensor(truncated, device=logits.device)
        tokens[index] = _sample_truncated(
            tempered[index].exp(), params.top_k[index], params.top_p[index], u[index]
        )
    raw = torch.log_softmax(logits, dim=-1)  # what is reported, as vLLM's raw_logprobs
    return tokens, raw.gather(1, tokens[:, None]).squeeze(1)


def draw_uniforms(rows: int, steps: int, seed: int | None) -> Tensor:
    """A `[rows, steps]` table of uniforms from a CPU generator seeded by `seed` (fresh entropy when None).

    Drawing on the CPU keeps a seeded request's completion independent of the device it runs on.
    """
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return torch.rand(rows, steps, generator=generator, dtype=torch.float32)


def prompt_logprobs(
    logits: Tensor,
    prompt: Sequence[int],
    top_k: int,
    decode: Callable[[list[int]], list[str]],
    chunk: int = 512,
) -> list[PromptLogprobEntry | None]:
    """vLLM's `prompt_logprobs` for one prompt from its prefill logits (`[len(prompt), V]`, position i
    predicting token i + 1).

    Entry 0 is None (nothing precedes the first token). Entry i maps `str(token_id)` to
    `{"logprob", "rank", "decoded_token"}` for the `top_k` most likely tokens and the actual prompt token,
    ordered by rank (1 = most likely). These are raw-model logprobs: temperature does not apply to scoring.
    `decode` turns a list of token ids into their texts, one per id.
    """
    targets = torch.tensor(list(prompt[1:]), dtype=torch.long, device=logits.device)
    actual_lp, actual_rank, top_ids, top_lps = [], [], [], []
    for start in range(0, len(targets), chunk):
        logprobs = torch.log_softmax(logits[start : start + chunk].float(), dim=-1)
        target = targets[start : start + chunk]
        lp = logprobs.gather(1, target[:, None])
        actual_lp += lp.squeeze(1).tolist()
        actual_rank += ((logprobs > lp).sum(dim=-1) + 1).tolist()
        if top_k > 0:
            values, ids = logprobs.topk(top_k, dim=-1)
            top_ids += ids.tolist()
            top_lps += values.tolist()
    texts = dict(
        zip(
            unique := sorted({*prompt[1:], *(t for ids in top_ids for t in ids)}),
            decode(unique),
            strict=True,
        )
    )
    entries: list[PromptLogprobEntry | None] = [None]
    for i, token in enumerate(prompt[1:]):
        ranked = (
            [(r + 1, t, lp) for r, (t, lp) in enumerate(zip(top_ids[i], top_lps[i], strict=True))]
            if top_k
            else []
        )
        if token not in {t for _, t, _ in ranked}:
            ranked.append((actual_rank[i], token, actual_lp[i]))
            ranked.sort(key=lambda entry: entry[0])
        entries.append({str(t): {"logprob": lp, "rank": r, "decoded_token": texts[t]} for r, t, lp in ranked})
    return entries
