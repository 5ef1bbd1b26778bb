"""A trainer's checkpoints on disk: the adapter alone (sampler weights, PEFT format) and the trainer state
(the adapter under `adapter/`, AdamW's `optimizer.pt`, the torch RNG's `rng.pt` and `trainer_state.json`).

Each is written into a temporary directory beside its final place and renamed over it only once complete,
so a crash or a full disk never leaves a half checkpoint where a good one was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from loops_nb.local.model_store import atomic_dir

STATE_FILE = "trainer_state.json"
STATE_FORMAT = 1


def write_adapter(path: Path, model: PeftModel) -> None:
    """The adapter in PEFT format, so `PeftModel.from_pretrained(base, path)` loads it."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(str(tmp))


def write_trainer_state(
    path: Path, model: PeftModel, optimizer: torch.optim.Optimizer, meta: Mapping[str, Any]
) -> None:
    """Adapter, optimizer, the process's torch RNG and `meta` (step, rank, ...) under `path`."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(str(tmp / "adapter"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"cpu": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps({"format": STATE_FORMAT, **meta}, indent=2))


@dataclass(frozen=True)
class SavedTrainerState:
    """What `read_trainer_state` found; the optimizer and RNG only when asked for."""

    meta: dict[str, Any]
    """`trainer_state.json`: step, lora_rank, lora_alpha, target_modules, base_model."""
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    rng: dict[str, Any] | None


def read_trainer_state(path: Path, *, with_optimizer: bool) -> SavedTrainerState:
    """A `write_trainer_state` directory; a missing file is a `FileNotFoundError`, anything unreadable a
    `ValueError`, each naming `path`."""
    try:
        meta = json.loads((path / STATE_FILE).read_text())
        weights = load_file(path / "adapter" / "adapter_model.safetensors")
        optimizer = torch.load(path / "optimizer.pt", weights_only=True) if with_optimizer else None
        rng = torch.load(path / "rng.pt", weights_only=True) if with_optimizer else None
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no trainer state at {path}: {Path(exc.filename).name} is missing") from None
    except Exception as exc:
        raise ValueError(f"trainer state at {path} is unreadable: {exc}") from exc
    return SavedTrainerState(meta, weights, optimizer, rng)


def load_adapter_weights(model: PeftModel, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Put saved LoRA weights into `model`'s adapter; refuse a state that does not fit it exactly."""
    result: Any = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"trainer state at {path} does not fit this model: missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]}"
        )
