"""What a trainer micro-batch's activations cost per token, and recomputing layers when they would not fit.

Training memory on a small model is dominated not by weights but by what autograd keeps for the backward:
every decoder layer's intermediates for every token (about 2.8 MB a token on SmolLM2-135M in fp32, 20x the
token's share of the weights). `ActivationCost.measure` counts exactly those bytes once, on the model as it
is (LoRA wrappers included), by running one short forward under `saved_tensors_hooks` and adding up every
saved tensor that is not a weight. The trainer sizes its micro-batches from it.

`plan_micro_batches` packs a request's datums into micro-batches whose activations fit the budget (with
shared prompts on, a prompt's rows together, priced as the shared forward runs them: `prefix_packing`).
When a single sequence would not fit the budget even alone, `checkpointed(layers)` makes each decoder layer
recompute its forward during the backward (`torch.utils.checkpoint`, non-reentrant), so autograd keeps only
each layer's input plus one layer's intermediates at a time. That costs about one more forward, so it is
used only where the budget demands it, or where it lets a group's rows run their shared prompt once
instead of once per few rows (`RECOMPUTE_COST`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from loops_nb.local.losses import micro_batches
from loops_nb.local.memory_budget import attention_shape
from loops_nb.local.prefix_packing import shared_micro_batches
from loops_nb.local.shared_prefix import PromptKey, forward_size, shared_groups

PROBE_TOKENS = 64


@dataclass(frozen=True)
class ActivationCost:
    """Bytes autograd keeps per token of a micro-batch, without and with layer recomputation."""

    full: int
    """Every layer's saved intermediates (what a plain forward keeps for its backward)."""
    checkpointed: int
    """Each layer's input, plus one layer's intermediates (what `checkpointed` keeps)."""
    shared_kv: int
    """Bytes per row and token of a prompt the rows share (`shared_prefix`): every layer's attention keeps
    the prompt's keys and values expanded to every row, and its copy expanded to every query head (sdpa's
    `repeat_kv`; counted even where there is none to expand, which only overstates it)."""
    shared_kv_checkpointed: int = 0
    """The same with layers recomputed: only the layer running holds its expansion (`shared_kv` / layers)."""

    def repeated(self, *, recompute: bool) -> int:
        """Bytes per row and shared prompt token, without or with layer recomputation."""
        return self.shared_kv_checkpointed if recompute else self.shared_kv

    def tokens(self, budget_bytes: int, *, recompute: bool) -> int:
        """Padded tokens per micro-batch that fit `budget_bytes` (at least 1)."""
        return max(1, budget_bytes // (self.checkpointed if recompute else self.full))

    @classmethod
    def measure(
        cls,
        forward: Callable[[torch.Tensor], torch.Tensor],
        model: torch.nn.Module,
        *,
        layers: int,
        hidden: int,
        element_bytes: int,
        device: torch.device,
        shared_kv: int,
    ) -> ActivationCost:
        """Run `forward(tokens)` once on `PROBE_TOKENS` tokens and count the bytes it saves for backward
        (`shared_kv` is passed through: the shape of the attention, not a measurement, gives it)."""
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}
        kept: list[torch.Tensor] = []

        def pack(tensor: torch.Tensor) -> None:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in weights:
                seen[storage.data_ptr()] = storage.nbytes()
            # Held here until the count is done (a freed storage reused by a later tensor would be counted
            # once for both), but not in the graph: a hook that returned the tensor would make each saved
            # output a cycle through its own autograd node, which Python's collector cannot see, and the
            # probe's activations (about 60 MB a client on `loops serve`) stayed alive for good.
            kept.append(tensor)

        vocab = int(model.get_input_embeddings().num_embeddings)  # type: ignore[operator]
        tokens = torch.randint(0, min(100, vocab), (1, PROBE_TOKENS), device=device)

        def unpack(_: None) -> torch.Tensor:
            raise RuntimeError("the activation probe runs no backward")

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = forward(tokens)
        del out
        kept.clear()
        full = max(1, sum(seen.values()) // PROBE_TOKENS)
        per_layer = full // max(1, layers)
        return cls(
            full=full,
            checkpointed=layers * hidden * element_bytes + per_layer,
            shared_kv=shared_kv,
            shared_kv_checkpointed=shared_kv // max(1, layers),
        )

    @classmethod
    def of_decoder(cls, lm: Any, device: torch.device) -> ActivationCost:
        """`measure` on a causal LM's decoder stack (its head's cost is bounded apart, see `lm_head`)."""
        text = getattr(lm.config, "text_config", None) or lm.config
        decoder = lm.get_decoder()
        layers, heads, kv_heads, head_dim = attention_shape(text)
        # Saved-tensor hooks are thread-local, so other trainers' work at the same time is not counted.
        return cls.measure(
            lambda ids: decoder(input_ids=ids, use_cache=False).last_hidden_state,
            lm,
            layers=layers,
            hidden=int(text.hidden_size),
            element_bytes=lm.dtype.itemsize,
            device=device,
            shared_kv=layers * 2 * (kv_heads + heads) * head_dim * lm.dtype.itemsize,
        )


RECOMPUTE_COST = 1.4
"""A recomputed micro-batch's time against the same positions with every layer kept: the forward runs twice.
Measured on SmolLM2-135M float32, one thread (`benchmarks shared_prefix`, the same shared positions at the
default budget, recomputed, and at 640 MB, kept: 204.9 against 286.4 tokens a second)."""


def plan_micro_batches(
    lengths: Sequence[int],
    cost: ActivationCost,
    *,
    budget_bytes: int,
    max_tokens: int,
    group: int,
    backward: bool,
    prompts: Sequence[PromptKey] | None = None,
) -> list[tuple[list[int], bool]]:
    """Micro-batches (datum indices, whether to recompute layers) whose activations fit `budget_bytes`;
    `group` consecutive datums stay together (dpo pairs).

    Datums short enough to fit the budget with every layer's intermediates kept are packed without
    recomputation; longer ones are packed at the recomputed cost. A forward without backward keeps
    no intermediates, so it packs at the recomputed cost too (one layer's transients at a time).

    `prompts` (each datum's `shared_prefix.prompt_key`) means rows share their prompts: a prompt's rows are
    packed together and priced as the shared forward runs them (`prefix_packing`). A prompt's rows also
    recompute their layers when that runs fewer positions by more than recomputing costs (`RECOMPUTE_COST`):
    at the quickstart's budget three of a group's 16 rows fit a micro-batch with every layer kept, and all
    16 with layers recomputed, so the prompt runs once instead of six times. Without `prompts`, rows x
    longest row as before.
    """
    plain = min(max_tokens, cost.tokens(budget_bytes, recompute=False))
    lean = min(max_tokens, cost.tokens(budget_bytes, recompute=True))

    def shared(members: list[int], recompute: bool) -> list[list[int]]:
        assert prompts is not None
        packed = shared_micro_batches(
            [lengths[i] for i in members],
            [prompts[i] for i in members],
            per_token=cost.checkpointed if recompute else cost.full,
            per_repeated=cost.repeated(recompute=recompute),
            budget_bytes=budget_bytes,
            max_tokens=max_tokens,
            group=group,
        )
        return [[members[j] for j in rows] for rows in packed]

    def positions(batches: list[list[int]]) -> int:
        assert prompts is not None
        return sum(forward_size([lengths[i] for i in b], [prompts[i] for i in b]).positions for b in batches)

    count = len(lengths)
    if not backward:
        if prompts is not None:
            return [(rows, False) for rows in shared(list(range(count)), True)]
        return [(rows, False) for rows in micro_batches(lengths, lean, group)]
    units = [list(range(i, min(i + group, count))) for i in range(0, count, group)]
    long = {i for u in units if max(lengths[i] for i in u) > plain for i in u}
    if prompts is not None:
        for members in _prompt_members(units, prompts, long):
            if RECOMPUTE_COST * positions(shared(members, True)) < positions(shared(members, False)):
                long.update(members)
    batches = []
    for recompute, members in (
        (False, [i for i in range(count) if i not in long]),
        (True, sorted(long)),
    ):
        if not members:
            continue
        if prompts is not None:
            batches += [(rows, recompute) for rows in shared(members, recompute)]
            continue
        for rows in micro_batches([lengths[i] for i in members], lean if recompute else plain, group):
            batches.append(([members[j] for j in rows], recompute))
    return batches


def _prompt_members(units: list[list[int]], prompts: Sequence[PromptKey], taken: set[int]) -> list[list[int]]:
    """The datums of each prompt that rows share (whole units, none of `taken`), as the forward groups them."""
    free = [u for u in units if not taken.intersection(u)]
    firsts = [next((prompts[i] for i in u if prompts[i] is not None), None) for u in free]
    groups, _ = shared_groups(firsts)
    return [[i for j in rows for i in free[j]] for rows, _ in groups]


@contextlib.contextmanager
def checkpointed(layers: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Recompute each of `layers` in the backward instead of keeping its intermediates."""
    for layer in layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # back to the class's forward
