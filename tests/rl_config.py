"""RL configs for tests, written as TOML the way a user writes `train.toml`.

`rl_config_toml(factory)` is the least config the loader accepts (`recipe = "rl"` and a runtime), for
tests of what `loops check` and the loader say. `tiny_run_toml(factory, base_model, out)` is a run on a
tiny model on the CPU: TINY_RUN below, under whatever the call gives. Either takes the other sections as
keyword dicts (`training={...}`, `output={...}`), merged key by key over the defaults, so a test states
only what it relies on; a None value removes a default key or table.

Import by name: `from rl_config import ...`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

# One step of one group of four (a group needs more than one attempt to have variance to train on),
# at LoRA rank 4, with the embedded Loops on the CPU whatever accelerator the machine has.
TINY_RUN: dict[str, dict[str, Any]] = {
    "model": {"lora_rank": 4},
    "compute": {"local": {"device": "cpu"}},
    "training": {"max_steps": 1, "group_size": 4, "groups_per_step": 1},
}

# Tables in the order train.toml files list them; any other section follows them.
ORDER = ("model", "compute", "runtime", "providers", "sampling", "training", "eval", "output")
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def rl_config_toml(
    factory: str, /, *, options: Mapping[str, Any] | None = None, **sections: Mapping[str, Any] | None
) -> str:
    """`recipe = "rl"`, `[runtime] factory`, `[runtime.options]` from `options`, and `sections`."""
    runtime: dict[str, Any] = {"factory": factory}
    if options:
        runtime["options"] = dict(options)
    tables = merge({"runtime": runtime}, sections)
    lines = ['recipe = "rl"']
    for name in sorted(tables, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        lines += table(name, tables[name])
    return "\n".join(lines) + "\n"


def tiny_run_toml(
    factory: str,
    base_model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    /,
    *,
    options: Mapping[str, Any] | None = None,
    **sections: Mapping[str, Any] | None,
) -> str:
    """A run of `factory` on `base_model` (a directory or hub id) writing under `out`: TINY_RUN, then
    `sections` (`model={...}` is the rest of the [model] table)."""
    where = {"model": {"base_model": base_model}, "output": {"output_dir": out}}
    return rl_config_toml(factory, options=options, **merge(merge(where, TINY_RUN), sections))


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on it: tables merge key by key, other values replace, None removes."""
    merged = dict(base)
    for k, v in over.items():
        if v is None:
            merged.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
            merged[k] = merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def table(name: str, values: Mapping[str, Any]) -> list[str]:
    """`[name]` with its plain keys, then each sub-table as `[name.key]`; a header with no keys is left out
    (TOML makes the parent table from the sub-table's header)."""
    plain = {k: v for k, v in values.items() if not isinstance(v, Mapping)}
    lines = [f"[{name}]", *(f"{key(k)} = {value(v)}" for k, v in plain.items())] if plain else []
    for k, v in values.items():
        if isinstance(v, Mapping):
            lines += table(f"{name}.{key(k)}", v)
    return lines


def key(name: str) -> str:
    return name if BARE_KEY.fullmatch(name) else value(name)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | os.PathLike):
        # JSON's string escapes are TOML's, except DEL, which TOML wants escaped and JSON does not.
        return json.dumps(os.fspath(v), ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(item) for item in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{key(k)} = {value(item)}" for k, item in v.items()) + " }"
    raise TypeError(f"no TOML for {v!r}")
