"""What changed in a run's config since the run started, checked when a run directory is resumed.

A resume continues the adapter, the optimizer state and the data order of the run it resumes, so the
settings those depend on must stay as they were: changing one is refused, with what to do. Other changes
(a longer `max_steps`, another learning rate, more logging) are allowed and listed in `run.log` and the
log, so a resumed run never changes silently. SFT also checks its data and batching plan step by step
when it resumes (`sft/loop.py`); this covers the settings around it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from loops_nb.errors import ConfigError

if TYPE_CHECKING:
    from loops_nb.run_dir import RunJson

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

ADDED_LATER: dict[str, object] = {"eval.holdout": 0.0}
"""Settings newer than some run directories, with the value a run.json written before them meant."""

_UNCHECKED = ("output.",)  # where the run's files go and how it reports: changing them changes no training


def config_changes(
    started: Mapping[str, object], now: Mapping[str, object]
) -> dict[str, tuple[object, object]]:
    """Dotted key → (value the run started with, value now), for the settings whose values differ."""
    after = flatten(now)
    before = {**{k: v for k, v in ADDED_LATER.items() if k in after}, **flatten(started)}
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if not key.startswith(_UNCHECKED) and before.get(key) != after.get(key)
    }


def resume_drift(
    recipe: str, run_json: RunJson | None, config: Mapping[str, object], run_dir: str
) -> list[str]:
    """Check a resume of the run described by `run_json` with `config` (a `model_dump` in JSON form).

    Raises ConfigError when the recipe or a setting of `FIXED[recipe]` changed; returns a line per allowed
    change, for run.log and the console (none for a new run, or a run.json written before configs were
    recorded)."""
    started = (run_json or {}).get("config")
    if run_json is None or not isinstance(started, dict):
        return []
    if run_json.get("recipe") not in (None, recipe):
        raise ConfigError(
            f"{run_dir} holds a {run_json.get('recipe')} run; this config is {recipe}: choose another "
            "--output.run_name"
        )
    changes = config_changes(started, config)
    fixed = [
        f"{key} = {_shown(changes[key][0])} (this config: {_shown(changes[key][1])})"
        for key in FIXED.get(recipe, ())
        if key in changes
    ]
    if fixed:
        raise ConfigError(
            f"{run_dir} was started with " + "; ".join(fixed) + ". A resume continues that run's adapter, "
            "optimizer and data order, so these must stay as they were: set them back, or start a new run "
            "with another --output.run_name"
        )
    return [
        f"changed since the run started: {key} = {_shown(new)} (was {_shown(old)})"
        for key, (old, new) in changes.items()
    ]


def flatten(config: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """``{"training.learning_rate": 0.02, ...}``: nested tables as dotted keys, as `--KEY VALUE` names them
    (an empty table stays a value)."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
