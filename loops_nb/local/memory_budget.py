"""How much memory the embedded Loops lets a trainer micro-batch and the sampler's KV cache use, and the
estimate of a run's peak that `loops check` prints.

Both budgets default to a quarter of the model's weight size, capped at a tenth of the memory available
when the trainer or sampler starts and never under 128 MiB: a small model on a laptop then stays small
(SmolLM2-135M: 135 MB each), a big one gets room without taking the machine (Qwen2-1.5B in fp32: 1.5 GB).
On a CPU, micro-batches of a few hundred tokens run within a few percent of one big batch (measured:
one 1,024-token batch 8.2-8.6 s, three of about 340 tokens 9.1-9.8 s), so a small budget costs little.
`[compute.local] memory_budget_mb` sets both explicitly.

The estimate adds up what a run holds at its peak from the model's files alone (no weights are loaded):
the runtime (Python, torch and transformers, measured at about 0.85 GB), the base weights once, the LoRA
adapter with its gradient and AdamW moments, the trainer's activation budget and the sampler's KV cache
for the run's concurrent rollouts.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from loops_nb.local.lora_targets import DEFAULT_TARGETS

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from loops_nb.config.sections import ComputeConfig, ModelConfig

MIB = 1024 * 1024
MIN_BUDGET = 128 * MIB
MAX_KV_TOKENS = 65536
"""The sampler's KV cache never holds more tokens than this, whatever the budget."""
RUNTIME_BYTES = 850 * MIB
"""Resident size of a process that has imported torch (a CUDA build), transformers and peft, measured."""
_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}


def available_bytes() -> int:
    """Memory this process may still use: the smaller of MemAvailable and the cgroup's headroom."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    if not found:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        found.append(pages * size)
    return max(0, min(found))


def default_budget(weight_bytes: int, available: int | None = None) -> int:
    """A quarter of the model's weight size, at most a tenth of `available`, at least 128 MiB."""
    available = available_bytes() if available is None else available
    return max(MIN_BUDGET, min(weight_bytes // 4, available // 10))


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a loaded model's parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def resolve_budget(budget_mb: int | None, weight_bytes: int) -> int:
    return budget_mb * MIB if budget_mb else default_budget(weight_bytes)


def attention_shape(config: object) -> tuple[int, int, int, int]:
    """(layers, heads, kv_heads, head_dim) of a model's text decoder, from its config (or its `text_config`)."""
    text = getattr(config, "text_config", None) or config
    heads = int(getattr(text, "num_attention_heads", None) or 1)
    head_dim = int(getattr(text, "head_dim", None) or int(getattr(text, "hidden_size", None) or 0) // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return int(getattr(text, "num_hidden_layers", None) or 0), heads, kv_heads, head_dim


def kv_token_budget(model: PreTrainedModel, budget_bytes: int) -> int:
    """Tokens of KV cache that fit `budget_bytes` (keys and values of every layer), at most 65,536."""
    layers, _, kv_heads, head_dim = attention_shape(model.config)
    per_token = 2 * layers * kv_heads * head_dim * model.dtype.itemsize
    return max(1024, min(MAX_KV_TOKENS, budget_bytes // per_token))


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's memory, read from its directory without loading it."""

    parameters: int
    linear_shapes: dict[str, list[tuple[int, int]]]
    """Weight shapes (out, in) of the 2-D tensors, by the last component of their module name."""
    layers: int
    kv_bytes_per_token_element: int
    """Key and value elements cached per token, over all layers (times the element size = bytes)."""
    max_positions: int | None

    @classmethod
    def read(cls, model_dir: Path) -> ModelShape:
        config = json.loads((model_dir / "config.json").read_text())
        text = config.get("text_config") or config
        parameters, shapes = 0, dict[str, list[tuple[int, int]]]()
        for file in sorted(model_dir.glob("*.safetensors")):
            for name, (dims, _) in _safetensors_header(file).items():
                count = 1
                for d in dims:
                    count *= d
                parameters += count
                parts = name.split(".")
                if len(dims) == 2 and parts[-1] == "weight" and len(parts) >= 2:
                    shapes.setdefault(parts[-2], []).append((dims[0], dims[1]))
        layers, _, kv_heads, head_dim = attention_shape(SimpleNamespace(**text))
        return cls(
            parameters=parameters,
            linear_shapes=shapes,
            layers=layers,
            kv_bytes_per_token_element=2 * layers * kv_heads * head_dim,
            max_positions=text.get("max_position_embeddings"),
        )

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        return sum(rank * (out + inp) for t in targets for out, inp in self.linear_shapes.get(t, []))


def _safetensors_header(path: Path) -> dict[str, tuple[list[int], str]]:
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return {k: (v["shape"], v["dtype"]) for k, v in header.items() if k != "__metadata__"}


@dataclass(frozen=True)
class PeakMemoryEstimate:
    """A run's expected peak resident memory on the embedded Loops, by part (bytes)."""

    runtime: int
    weights: int
    adapter: int
    """The LoRA weights (trainer and sampler copies), their gradient and AdamW's two moments."""
    activations: int
    kv_cache: int
    available: int
    prefix_cache: int = 0
    """The sampler's prefix cache at its bound (`prefix_cache_mb`): finished sequences' keys and values."""

    @property
    def total(self) -> int:
        return (
            self.runtime + self.weights + self.adapter + self.activations + self.kv_cache + self.prefix_cache
        )

    def describe(self) -> list[str]:
        gb = 1024**3
        parts = (
            f"runtime {self.runtime / gb:.2f}, weights {self.weights / gb:.2f}, adapter+optimizer "
            f"{self.adapter / gb:.2f}, activations {self.activations / gb:.2f}, KV cache {self.kv_cache / gb:.2f}, "
            f"prefix cache {self.prefix_cache / gb:.2f}"
        )
        lines = [
            f"memory: about {self.total / gb:.1f} GB at peak ({parts} GB); {self.available / gb:.1f} GB available"
        ]
        if self.total > self.available:
            lines.append(
                f"warning: the run may need {self.total / gb:.1f} GB but {self.available / gb:.1f} GB is "
                "available; lower [compute.local] memory_budget_mb, training.max_concurrent_rollouts or "
                "model.max_seq_len, or pick a smaller model"
            )
        return lines


def estimate_peak(
    model_dir: Path,
    *,
    element_bytes: int,
    lora_rank: int,
    targets: tuple[str, ...],
    max_seq_len: int,
    concurrent_sequences: int,
    budget_mb: int | None = None,
    sampler_tokens_cap: int = MAX_KV_TOKENS,
    bf16_products: bool = False,
    prefix_cache_mb: int | None = None,
) -> PeakMemoryEstimate:
    """`bf16_products` (`dtype = "bf16-mixed"`): the linear layers but the head hold 2-byte weights."""
    shape = ModelShape.read(model_dir)
    weights = shape.parameters * element_bytes
    if bf16_products:
        products = sum(
            o * i
            for name, dims in shape.linear_shapes.items()
            if name != "lm_head" and "embed" not in name  # the head and embeddings stay float32
            for o, i in dims
        )
        weights -= products * (element_bytes - 2)
    budget = resolve_budget(budget_mb, weights)
    lora = shape.lora_parameters(lora_rank, targets) * 4  # LoRA and AdamW stay fp32
    kv_per_token = shape.kv_bytes_per_token_element * element_bytes
    kv_tokens = min(concurrent_sequences * max_seq_len, sampler_tokens_cap, budget // max(1, kv_per_token))
    return PeakMemoryEstimate(
        runtime=RUNTIME_BYTES,
        weights=weights,
        adapter=lora * 5,  # trainer weights, gradient, two moments; the sampler's copy
        activations=budget,
        kv_cache=kv_tokens * kv_per_token,
        available=available_bytes(),
        prefix_cache=budget if prefix_cache_mb is None else prefix_cache_mb * MIB,  # as the sampler sizes it
    )


def check_lines(
    compute: ComputeConfig, model: ModelConfig, *, concurrent_sequences: int
) -> tuple[list[str], list[str]]:
    """What `loops check` says of a local run's memory: (lines, warnings). Nothing for other scopes or for a
    run that joins a running `loops serve` (whose memory is that server's)."""
    if compute.scope != "local" or compute.base_url or os.environ.get("LOOPS_BASE_URL"):
        return [], []
    from loops_nb.errors import UserError
    from loops_nb.local.model_store import bf16_products, device_and_dtype, resolve_model

    try:
        _, dtype = device_and_dtype(compute.local.device, compute.local.dtype)
        estimate = estimate_peak(
            resolve_model(model.base_model, cache_dir=compute.local.cache_dir).path,
            element_bytes=dtype.itemsize,
            lora_rank=model.lora_rank,
            targets=DEFAULT_TARGETS,
            max_seq_len=model.max_seq_len,
            concurrent_sequences=concurrent_sequences,
            budget_mb=compute.local.memory_budget_mb,
            bf16_products=bf16_products(compute.local.dtype),
            prefix_cache_mb=compute.local.prefix_cache_mb,
        )
    except (UserError, OSError, ValueError, KeyError):  # the model itself is checked (and reported) elsewhere
        return [], []
    lines = estimate.describe()
    return lines[:1], lines[1:]
