"""How a pydantic `ValidationError` reads to a person: one `Problem` per error, with its place written the way
the input looks (``messages[2].weight``, ``data[3].loss_fn_inputs.weights``) and pydantic's own message.

Every boundary that validates with pydantic (the config loader, renderer options, a saved run's config, the
embedded Loops' request bodies, SFT rows) words its refusal from these, adding only what it knows itself
(the file, the override, the valid keys).
"""

from __future__ import annotations

import functools
from collections.abc import Container
from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class Problem:
    """One error of a `ValidationError`."""

    loc: tuple[int | str, ...]
    """pydantic's location, less the parts the caller skipped."""
    path: str
    """`loc` written as an access path; "" for the top level."""
    kind: str
    """pydantic's error type, e.g. "missing", "extra_forbidden", "int_type", "value_error"."""
    message: str
    """pydantic's message; for a validator's own error, that error's text (without "Value error, ")."""
    given: object
    """The input at fault."""


def problems(exc: ValidationError, *, skip: Container[object] = ()) -> list[Problem]:
    """The errors of `exc`, in pydantic's order; `loc` parts in `skip` (say, a union's tag) are left out."""
    found = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in skip))
        path = functools.reduce(extend_path, loc, "")
        ctx = err.get("ctx") or {}
        message = str(ctx["error"]) if err["type"] == "value_error" and "error" in ctx else err["msg"]
        found.append(Problem(loc, path, err["type"], message, err.get("input")))
    return found


def validation_message(exc: ValidationError, *, top: str = "body") -> str:
    """Every problem as ``path: message``, joined by "; " (`top` names the top level)."""
    return "; ".join(f"{p.path or top}: {p.message}" for p in problems(exc))


def extend_path(path: str, key: object) -> str:
    """``path`` extended by a list index or an object key; odd keys (not identifiers) are quoted and cut."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier() and len(key) <= 40:
        return f"{path}.{key}" if path else key
    return f"{path}[{show(key)}]"


def show(value: object, limit: int = 40) -> str:
    """A value as it may appear in a refusal: ``repr`` cut to ``limit`` characters, so one line stays one short
    line (repr escapes newlines and surrogates) however long the value is."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        # repr of a huge int is long, and past 4300 digits raises ValueError
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    text = repr(value) if isinstance(value, str | int | float | bool) or value is None else json_type(value)
    return text if len(text) <= limit + 2 else f"{text[:limit]}..."


def json_type(value: object) -> str:
    """What JSON value `value` is, in words ("the number 3", "a list")."""
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
