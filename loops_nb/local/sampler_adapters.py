"""The LoRA adapters the local sampler serves, as named PEFT adapters on its one copy of the base model.

The base model is loaded once; each adapter key (the live RL policy, a named checkpoint) is a PEFT adapter
on it, with its own config, so ranks and target modules may differ between keys. A batch runs with exactly
one adapter active, or with all of them disabled for the base model: PEFT's disabled LoRA layers call the
wrapped base layer alone, so base outputs are bit-identical to the plain model's.

Replacing the weights of an existing key with an unchanged config is the hot path (the trainer publishes the
live policy every RL step), so it is an in-place `copy_` into the adapter's existing parameters; only a new
key or a changed config goes through PEFT's `add_adapter`/`set_peft_model_state_dict`.

Not thread-safe on its own: the sampler engine calls it only from its worker thread, between batches.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from peft import LoraConfig, LoraModel, PeftModel, get_peft_model, set_peft_model_state_dict
from torch import Tensor, nn

from loops_nb.local.lora_in_place import add_update_in_place

# PEFT names a saved adapter's tensors relative to the PeftModel wrapper.
_PEFT_PREFIX = "base_model.model."
# "...lora_A.<adapter>.weight" -> "...lora_A.weight": the saved form carries no adapter name.
_ADAPTER_SEGMENT = re.compile(r"\.(lora_[A-Za-z_]+)\.(?!weight$|bias$)[^.]+\.(weight|bias)$")
# Config keys that say where an adapter came from, not what it computes.
_PROVENANCE_KEYS = {"base_model_name_or_path", "revision", "inference_mode", "peft_version", "auto_mapping"}


def lora_config_from_dict(config: Mapping[str, Any]) -> LoraConfig:
    """A `LoraConfig` from an `adapter_config.json`-style dict (unknown keys dropped, inference mode on)."""
    peft_type = str(config.get("peft_type", "LORA")).rsplit(".", 1)[-1].upper()
    if peft_type != "LORA":
        raise ValueError(f"lora_config: peft_type {config['peft_type']!r} is not LORA")
    accepted = {f.name for f in dataclasses.fields(LoraConfig) if f.init}
    kwargs = {k: v for k, v in config.items() if k in accepted}
    kwargs["inference_mode"] = True
    return LoraConfig(**kwargs)


def _fingerprint(config: LoraConfig) -> str:
    described = {k: v for k, v in config.to_dict().items() if k not in _PROVENANCE_KEYS}
    # A set (the target modules) in order, so equal configs match; a value JSON has no form for, as text.
    return json.dumps(described, sort_keys=True, default=_json_form)


def _json_form(value: object) -> object:
    return sorted(value) if isinstance(value, (set, frozenset)) else str(value)


def _adapter_of(name: str) -> str | None:
    """The adapter a LoRA tensor name belongs to ("...lora_B.adapter3.weight" -> "adapter3")."""
    match = _ADAPTER_SEGMENT.search(name)
    return None if match is None else match.group(0).split(".")[2]


def saved_key(name: str) -> str:
    """A LoRA tensor name in PEFT's saved form: `base_model.model.` prefix, no adapter-name segment."""
    name = _ADAPTER_SEGMENT.sub(r".\1.\2", name)
    return name if name.startswith(_PEFT_PREFIX) else _PEFT_PREFIX + name


@dataclass
class _Adapter:
    # PEFT's name for it: keys are arbitrary strings (checkpoint paths), PEFT names must be module-safe.
    name: str
    fingerprint: str
    version: int
    # Saved-form tensor name -> the live parameter it is copied into.
    params: dict[str, Tensor]


class AdapterSet:
    """Named LoRA adapters on a base model; `activate(key)` selects which one the next forward uses."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._peft: PeftModel | None = None
        self._adapters: dict[str, _Adapter] = {}
        self._counter = 0

    def version(self, key: str) -> int | None:
        entry = self._adapters.get(key)
        return None if entry is None else entry.version

    @torch.no_grad()
    def install(
        self, key: str, config: Mapping[str, Any], state_dict: Mapping[str, Tensor], version: int
    ) -> None:
        """Install `state_dict` as adapter `key`, replacing it in place when its config is unchanged."""
        lora_config = lora_config_from_dict(config)
        fingerprint = _fingerprint(lora_config)
        weights = {saved_key(name): tensor for name, tensor in state_dict.items()}
        entry = self._adapters.get(key)
        if entry is not None and entry.fingerprint == fingerprint and self._fits(entry, weights):
            for name, tensor in weights.items():
                entry.params[name].copy_(tensor)
            entry.version = version
            return
        if entry is not None:
            self.remove(key)
        self._counter += 1
        name = f"adapter{self._counter}"
        self._add(name, lora_config, weights)
        self._adapters[key] = _Adapter(name, fingerprint, version, self._params_of(name))

    @staticmethod
    def _fits(entry: _Adapter, weights: Mapping[str, Tensor]) -> bool:
        return weights.keys() == entry.params.keys() and all(
            entry.params[name].shape == tensor.shape for name, tensor in weights.items()
        )

    def _add(self, name: str, config: LoraConfig, weights: dict[str, Tensor]) -> None:
        with warnings.catch_warnings():
            # transformers deprecates a property PEFT still reads; nothing for our users to act on.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            if self._peft is None:
                self._peft = get_peft_model(self._model, config, adapter_name=name)
            else:
                self._peft.add_adapter(name, config)
        assert self._peft is not None
        try:
            result: Any = set_peft_model_state_dict(self._peft, weights, adapter_name=name)
            unexpected = list(result.unexpected_keys)
            missing = [key for key in result.missing_keys if _adapter_of(key) == name]
            if unexpected or missing:
                raise ValueError(
                    f"state_dict: does not match the adapter's lora_config "
                    f"(unexpected {unexpected[:3]}, missing {missing[:3]})"
                )
        except Exception:
            self._peft.delete_adapter(name)
            raise
        self._model.requires_grad_(False)
        add_update_in_place(self._peft)  # a new adapter may wrap layers the earlier ones did not

    def _params_of(self, name: str) -> dict[str, Tensor]:
        assert self._peft is not None
        return {saved_key(p): param for p, param in self._peft.named_parameters() if _adapter_of(p) == name}

    def remove(self, key: str) -> None:
        entry = self._adapters.pop(key, None)
        if entry is not None and self._peft is not None:
            with warnings.catch_warnings():
                # PEFT warns that another adapter became "active"; batches activate theirs explicitly.
                warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
                self._peft.delete_adapter(entry.name)

    def activate(self, key: str | None) -> int | None:
        """Make adapter `key` (None: none, the base model) the one forwards use; returns its version."""
        if self._peft is None:
            if key is not None:
                raise KeyError(key)
            return None
        lora_model = cast(LoraModel, self._peft.base_model)
        if key is None:
            lora_model.disable_adapter_layers()
            return None
        entry = self._adapters[key]
        lora_model.enable_adapter_layers()
        lora_model.set_adapter(entry.name, inference_mode=True)
        return entry.version


def read_adapter_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The config and weights of a PEFT `save_pretrained` directory (safetensors, else the legacy .bin)."""
    directory = Path(path)
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{directory} holds no adapter_config.json (not a PEFT adapter directory)")
    config = json.loads(config_file.read_text())
    if (directory / "adapter_model.safetensors").is_file():
        from safetensors.torch import load_file

        weights = load_file(directory / "adapter_model.safetensors")
    elif (directory / "adapter_model.bin").is_file():
        weights = torch.load(directory / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{directory} holds no adapter_model.safetensors or adapter_model.bin")
    return config, weights
