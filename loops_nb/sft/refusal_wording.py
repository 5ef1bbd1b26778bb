"""How a refused SFT row is worded: the field at fault as a path, values quoted short, one line each.

Also the checks that run before validation because a later stage would crash on them: nesting deeper than
`MAX_DEPTH` and strings holding a lone UTF-16 surrogate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

# Deeper rows are refused before validation. Without a bound, JSON nested a few thousand levels deep raises
# RecursionError in json.loads, and a few hundred levels inside tool arguments passes validation but makes pydantic's
# serializer (and Jinja's tojson) fail mid-render. 100 levels leaves ample room for real tool argument schemas.
MAX_DEPTH = 100

_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def validation_reason(exc: ValidationError) -> str:
    """One line naming the first field at fault, e.g. ``messages[2].weight: must be 0 or 1, got 2``."""
    err = exc.errors(include_url=False)[0]
    path = ""
    for part in err["loc"]:
        path = _path(path, part)
    path = _cut(path)
    kind = err["type"]
    if kind == "value_error":
        msg = str(err["ctx"]["error"])
    elif kind == "missing":
        msg = "required field missing"
    elif kind == "extra_forbidden":
        msg = "unknown field"
    elif kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[kind]}, got {json_type(err['input'])}"
    else:
        msg = err["msg"]
    # Model-level checks already name their field in the message.
    if not path:
        return msg
    if msg.startswith("["):
        return f"{path}{msg}"
    return f"{path}: {msg}"


def unreadable(obj: Any, root: str = "the row") -> str | None:
    """Why a decoded row cannot be read as text at all, naming the place: nesting deeper than `MAX_DEPTH`, or a
    string holding a lone UTF-16 surrogate (JSON's ``"\\ud800"`` decodes to one). Such a string is not text: the
    tokenizer cannot encode it and printing it fails, so it is refused here rather than crash a later stage.

    Iterative, so it never recurses itself; in-memory records that contain themselves stop at the depth bound.
    """
    stack: list[tuple[Any, str, int]] = [(obj, root, 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return (
                        f"{_cut(where)}: contains a lone surrogate ({value[exc.start]!r} at character {exc.start}), "
                        f"which is not text; fix the program that wrote the file"
                    )
        elif isinstance(value, Mapping | list | tuple):
            if depth >= MAX_DEPTH:
                return f"{_cut(where)}: JSON nested more than {MAX_DEPTH} levels deep"
            path = "" if depth == 0 else where
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    stack.append((key, f"the key {show(key)} of {path or root}", depth + 1))
                stack.append((item, _path(path, key), depth + 1))
    return None


def _cut(path: str, limit: int = 80) -> str:
    return path if len(path) <= limit else f"{path[:limit]}..."


def _path(path: str, key: Any) -> str:
    """``path`` extended by a list index or an object key; odd keys (not identifiers) are quoted and cut."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier() and len(key) <= 40:
        return f"{path}.{key}" if path else key
    return f"{path}[{show(key)}]"


def show(value: Any, limit: int = 40) -> str:
    """A value as it may appear in a refusal: ``repr`` cut to ``limit`` characters, so one line stays one short
    line (repr escapes newlines and surrogates) however long the value the row holds."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        # repr of a huge int is long, and past 4300 digits raises ValueError
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    text = repr(value) if isinstance(value, str | int | float | bool) or value is None else json_type(value)
    return text if len(text) <= limit + 2 else f"{text[:limit]}..."


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {show(value)}"
    if isinstance(value, str):
        return f"the string {show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
