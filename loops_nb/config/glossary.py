"""Every setting, listed from the schema: `loops run --help` and docs/reference/KNOB_GLOSSARY.md.

Both are generated here so the docs cannot drift from the code; a test fails when the committed
glossary is stale (`loops glossary --write` regenerates it).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from loops_nb.config.loader import models_in
from loops_nb.config.schema import RECIPES

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

SHARED_SECTIONS = ("model", "compute", "output")


@dataclass(frozen=True)
class Knob:
    key: str
    type: str
    default: str
    description: str


def _type_name(annotation: object) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in typing.get_args(annotation))
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if args and typing.get_origin(annotation) is dict:
        return f"table of {_type_name(args[1])} by name"
    if args:
        return str(annotation).replace("typing.", "")
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "(required)"
    value = info.get_default(call_default_factory=True)  # the factory's value, or the default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return f'"{value}"'
    return str(value)


def iter_knobs(model: type[BaseModel], prefix: str = "") -> Iterator[Knob]:
    """Every leaf setting of a config model, as dotted keys."""
    for name, info in model.model_fields.items():
        key, origin = f"{prefix}{name}", typing.get_origin(info.annotation)
        models = models_in(info.annotation)
        description = " ".join((info.description or "").split())
        if models and origin is None:  # a section
            yield from iter_knobs(models[0], key + ".")
        elif models and origin is dict:
            # `[providers.<name>]`-style tables: the table itself, then each kind's own settings.
            yield Knob(key, "tables by name", _default(info), description)
            for variant in models:
                yield from iter_knobs(variant, f"{key}.<name>.")
        else:
            yield Knob(key, _type_name(info.rebuild_annotation()), _default(info), description)


def _table(knobs: list[Knob]) -> list[str]:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for k in knobs:
        cells = (f"`{k.key}`", k.type, f"`{k.default}`", k.description)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def glossary_markdown() -> str:
    """The whole KNOB_GLOSSARY.md."""
    lines = [
        "# Knob glossary",
        "",
        "<!-- Generated from loops_nb's config schema by `loops glossary --write`; do not edit. -->",
        "",
        "Every setting a config can hold, with its type and default. Any of them can be overridden on",
        "the command line (`loops run train.toml --training.max_steps 5`) or in Python",
        '(`load(path, overrides={"training.max_steps": 5})`).',
        "",
        "## Shared by both recipes",
        "",
    ]
    shared = [k for k in iter_knobs(RECIPES["rl"]) if k.key.split(".")[0] in SHARED_SECTIONS]
    lines += _table(shared)
    for recipe, model in RECIPES.items():
        own = [k for k in iter_knobs(model) if k.key.split(".")[0] not in SHARED_SECTIONS]
        lines += ["", f'## recipe = "{recipe}"', "", *_table(own)]
    return "\n".join(lines) + "\n"


def knob_help(recipe: str | None = None) -> str:
    """Plain-text settings list for `loops run --help`: one recipe's, or both."""
    out = []
    for name, model in RECIPES.items():
        if recipe and name != recipe:
            continue
        out.append(f'settings of recipe = "{name}" (override with --KEY VALUE):')
        for k in iter_knobs(model):
            if k.key == "recipe":
                continue
            out.append(f"  --{k.key} {k.type}  (default {k.default})")
            if k.description:
                out.append(f"      {k.description}")
    return "\n".join(out)


GLOSSARY_PATH = Path("docs/reference/KNOB_GLOSSARY.md")
