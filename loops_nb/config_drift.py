"""What changed in a run's config since the run started, checked when a run directory is resumed.

A resume continues the adapter, the optimizer state and the data order of the run it resumes, so the
settings those depend on must stay as they were: changing one is refused, with what to do. Other changes
(a longer `max_steps`, another learning rate, more logging) are allowed and listed in `run.log` and the
log, so a resumed run never changes silently. SFT also checks its data and batching plan step by step
when it resumes (`sft/loop.py`); this covers the settings around it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loops_nb.errors import ConfigError

FIXED: dict[str, tuple[str, ...]] = {
    "rl": (
        "model.base_model",
        "model.lora_rank",
        "compute.scope",
        "runtime.factory",
        "training.seed",
        "training.group_size",
        "training.groups_per_step",
        "eval.holdout",
    ),
    "sft": ("model.base_model", "model.lora_rank", "compute.scope"),
}
"""Per recipe, the settings a resume must keep: the checkpoint's shape, where it lives, and the order in
which tasks or examples are drawn (a pure function of these)."""

ADDED_LATER: dict[str, Any] = {"eval.holdout": 0.0}
"""Settings newer than some run directories, with the value a run.json written before them meant."""

_UNCHECKED = ("output.",)  # where the run's files go and how it reports: changing them changes no training


@dataclass(frozen=True)
class ConfigDrift:
    """The settings whose values differ between the run's first config and this one."""

    changes: dict[str, tuple[Any, Any]]
    """Dotted key → (value the run started with, value now)."""

    @classmethod
    def between(cls, started: dict[str, Any], now: dict[str, Any]) -> ConfigDrift:
        after = _flatten(now)
        before = {**{k: v for k, v in ADDED_LATER.items() if k in after}, **_flatten(started)}
        changes = {
            key: (before.get(key), after.get(key))
            for key in sorted(before.keys() | after.keys())
            if not key.startswith(_UNCHECKED) and before.get(key) != after.get(key)
        }
        return cls(changes)

    def refuse_fixed(self, recipe: str, run_dir: str) -> None:
        """Raise ConfigError naming every setting of `FIXED[recipe]` that changed."""
        fixed = [key for key in FIXED.get(recipe, ()) if key in self.changes]
        if not fixed:
            return
        lines = [
            f"{key} = {_shown(self.changes[key][0])} (this config: {_shown(self.changes[key][1])})"
            for key in fixed
        ]
        raise ConfigError(
            f"{run_dir} was started with " + "; ".join(lines) + ". A resume continues that run's adapter, "
            "optimizer and data order, so these must stay as they were: set them back, or start a new run "
            "with another --output.run_name"
        )

    def lines(self) -> list[str]:
        """One line per allowed change, for run.log and the console."""
        return [
            f"changed since the run started: {key} = {_shown(new)} (was {_shown(old)})"
            for key, (old, new) in self.changes.items()
        ]


def resume_drift(
    recipe: str, run_json: dict[str, Any] | None, config: dict[str, Any], run_dir: str
) -> list[str]:
    """Check a resume of the run described by `run_json` with `config` (a `model_dump` in JSON form).

    Raises ConfigError when the recipe or a fixed setting changed; returns the lines naming the allowed
    changes (none for a new run, or a run.json written before configs were recorded)."""
    if not run_json or not isinstance(run_json.get("config"), dict):
        return []
    if run_json.get("recipe") not in (None, recipe):
        raise ConfigError(
            f"{run_dir} holds a {run_json['recipe']} run; this config is {recipe}: choose another "
            "--output.run_name"
        )
    drift = ConfigDrift.between(run_json["config"], config)
    drift.refuse_fixed(recipe, run_dir)
    return drift.lines()


def _flatten(tree: object, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(
            _flatten(value, f"{prefix}{key}.")
            if isinstance(value, dict) and value
            else {f"{prefix}{key}": value}
        )
    return flat


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
