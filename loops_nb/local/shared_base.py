"""One frozen copy of each base model in memory, however many trainers and samplers use it.

The embedded Loops runs a sampler and one LoRA trainer per run on the same base model. Each needs its own
module tree, because PEFT wraps the tree's linear layers in place (the sampler with its named adapters, each
trainer with its own), but none of them ever changes a base weight. So the base is loaded once per (model,
device, dtype) and every user gets a *structural* copy: `copy.deepcopy` with every parameter and buffer
pre-entered in the memo, so the copy's modules are new objects that hold the very same tensors. A run on
`loops serve` then adds only its adapter, optimizer state and caches, not another base.

The loaded models are held weakly: when the last trainer and sampler built on one are gone, so is the base.
"""

from __future__ import annotations

import copy
import itertools
import threading
import weakref
from pathlib import Path
from typing import Any

import torch

from loops_nb.local.image_chunks import load_model
from loops_nb.local.mixed_precision import use_bf16_products


class SharedBaseModels:
    """Loads each base model once and hands out module trees that share its frozen tensors."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: weakref.WeakValueDictionary[tuple[str, str, str, str], Any] = (
            weakref.WeakValueDictionary()
        )
        # A structural copy keeps its source alive, so the weak entry lives exactly as long as its users.
        self._sources: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def instance(
        self, model_path: str | Path, device: torch.device, dtype: torch.dtype, *, bf16_products: bool = False
    ) -> Any:
        """A module tree of the base model (eval mode, no gradients) whose tensors are shared.

        `bf16_products`: a float32 model whose linear layers multiply in bf16 (`dtype = "bf16-mixed"`)."""
        key = (str(Path(model_path).resolve()), str(device), str(dtype), str(bf16_products))
        with self._lock:
            base = self._loaded.get(key)
            if base is None:
                base = load_model(model_path, dtype).to(device).eval().requires_grad_(False)
                if bf16_products:
                    use_bf16_products(base)
                self._loaded[key] = base
            clone = structural_copy(base)
            self._sources[clone] = base
        return clone

    def loaded(self) -> int:
        """How many distinct base models are in memory now."""
        with self._lock:
            return len(self._loaded)


def structural_copy(model: torch.nn.Module) -> Any:
    """A deep copy of `model`'s modules and config that shares (does not copy) its parameters and buffers."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    memo: dict[int, Any] = {id(tensor): tensor for tensor in tensors}
    return copy.deepcopy(model, memo)


BASE_MODELS = SharedBaseModels()
"""The process-wide store: trainers and samplers of every embedded Loops in this process share it."""
