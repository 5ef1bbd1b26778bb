"""What a trainer micro-batch's activations cost per token, and recomputing layers when they would not fit.

Training memory on a small model is dominated not by weights but by what autograd keeps for the backward:
every decoder layer's intermediates for every token (about 1.2 MB a token on SmolLM2-135M in fp32, so 128
tokens keep more than a quarter of the weights' size). `ActivationCost.measure` counts exactly those bytes
once, on the model as it is (LoRA wrappers included), by running one short forward under
`saved_tensors_hooks` and adding up every saved tensor that is not a weight. The trainer sizes its
micro-batches from it.

When a micro-batch would not fit the budget with every layer's intermediates kept, `checkpointed(layers)`
makes some decoder layers recompute their forward during the backward (`torch.utils.checkpoint`,
non-reentrant): each such layer keeps only its input, and its intermediates come back one layer at a
time. Recomputing every layer costs about one more forward (a third of a step), so the trainer recomputes
only as many layers as the budget demands, and the first ones: by the time the backward reaches them,
every later layer's intermediates are freed, so their recomputed intermediates never add to the peak.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

PROBE_TOKENS = 64


@dataclass(frozen=True)
class ActivationCost:
    """Bytes autograd keeps per token of a micro-batch, by how many decoder layers are recomputed."""

    full: int
    """Every layer's saved intermediates (what a plain forward keeps for its backward)."""
    layers: int
    layer_input: int
    """What a recomputed layer keeps instead: its input (hidden size x element size)."""

    @property
    def per_layer(self) -> int:
        return max(1, self.full // max(1, self.layers))

    def per_token(self, recomputed: int = 0) -> int:
        """Bytes per token kept at the peak with the first `recomputed` layers recomputed.

        The backward starts with the later layers' intermediates and every recomputed layer's input held;
        when it reaches the recomputed layers, only their inputs and one layer's intermediates remain.
        """
        recomputed = min(max(0, recomputed), self.layers)
        if recomputed == 0:
            return self.full
        kept = self.full - recomputed * self.per_layer + recomputed * self.layer_input
        return max(kept, recomputed * self.layer_input + self.per_layer)

    @property
    def checkpointed(self) -> int:
        """Bytes per token with every layer recomputed, the least a micro-batch can keep."""
        return self.per_token(self.layers)

    def tokens(self, budget_bytes: int, *, recomputed: int = 0) -> int:
        """Padded tokens per micro-batch that fit `budget_bytes` (at least 1)."""
        return max(1, budget_bytes // self.per_token(recomputed))

    def layers_to_recompute(self, tokens: int, budget_bytes: int) -> int:
        """The fewest layers to recompute for `tokens` padded tokens to fit `budget_bytes` (all of them
        when even that does not fit: such a micro-batch holds a single datum, the least there is)."""
        for recomputed in range(self.layers + 1):
            if tokens * self.per_token(recomputed) <= budget_bytes:
                return recomputed
        return self.layers

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
    ) -> ActivationCost:
        """Run `forward(tokens)` once on `PROBE_TOKENS` tokens and count the bytes it saves for backward."""
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
        return cls(full=full, layers=max(1, layers), layer_input=hidden * element_bytes)


@contextlib.contextmanager
def checkpointed(layers: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Recompute each of `layers` in the backward instead of keeping its intermediates."""
    for layer in layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # back to the class's forward
