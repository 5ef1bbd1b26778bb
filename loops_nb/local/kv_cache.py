"""The sampler's KV cache: transformers' `DynamicCache`, with full-attention layers that grow in place.

`DynamicLayer.update` concatenates each new token's keys and values onto the cache, so every decode step
copies the whole cache of every layer (SmolLM2-135M, 16 rows, on a CPU: 1% of sampling time at 64-token
completions, 12% at 384). `GrowingLayer` writes into a buffer with room for `HEADROOM` more tokens and hands
attention a view of its filled part: the same numbers bit for bit, one token copied a step. `bound_growth`
caps the room at what a batch can still feed back (unbounded, the quickstart's batch held 320 MB of buffers
for 175 MB ever filled). A layer whose `keys`/`values` were replaced (the decode batch drops, pads and merges
rows by assigning new tensors) notices they are no longer its view and takes a fresh buffer at its next update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

HEADROOM = 64
"""Tokens of spare room per reallocation: a copy every 64 decode steps instead of every step, for at most 64
tokens of cache per row that the KV budget does not count."""


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values are views of buffers with spare room."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._view: torch.Tensor | None = None
        self.bound: int | None = None
        """The most tokens this layer will hold (`bound_growth`); None: unknown, so `HEADROOM` spare."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys = self.keys
        assert keys is not None
        length = keys.shape[-2] if keys.numel() else 0
        end = length + key_states.shape[-2]
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        if key_buffer is None or value_buffer is None or keys is not self._view or end > key_buffer.shape[-2]:
            capacity = end + HEADROOM if self.bound is None else max(end, min(end + HEADROOM, self.bound))
            key_buffer, value_buffer = self._reallocate(key_states, value_states, length, capacity)
        key_buffer[:, :, length:end].copy_(key_states)
        value_buffer[:, :, length:end].copy_(value_states)
        self.keys, self.values = key_buffer[:, :, :end], value_buffer[:, :, :end]
        self._view = self.keys
        return self.keys, self.values

    def _reallocate(
        self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New buffers of `capacity` tokens shaped like the incoming states, holding the `length` cached."""
        batch, heads, _, key_dim = key_states.shape
        key_buffer = key_states.new_empty(batch, heads, capacity, key_dim)
        value_buffer = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if length:
            assert self.keys is not None and self.values is not None
            key_buffer[:, :, :length].copy_(self.keys)
            value_buffer[:, :, :length].copy_(self.values)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        return key_buffer, value_buffer


def bound_growth(cache: DynamicCache, tokens: int) -> None:
    """Tell `cache`'s growing layers they will hold at most `tokens` tokens (room beyond is never used)."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.bound = tokens


def growing_cache(config: PretrainedConfig) -> DynamicCache:
    """A `DynamicCache` for `config` whose plain full-attention layers are `GrowingLayer`s (sliding-window
    and other layer kinds are kept as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def is_full_attention(layer: object) -> bool:
    """A plain full-attention layer (one rows can be left-padded and merged into)."""
    return type(layer) in (DynamicLayer, GrowingLayer)


def cache_is_full_attention(config: PretrainedConfig) -> bool:
    """Whether every cache layer of a model with `config` is plain full attention (rows can be merged into
    a batch, or a prompt's keys and values repeated for several rows)."""
    return all(is_full_attention(layer) for layer in growing_cache(config).layers)
