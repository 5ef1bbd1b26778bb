"""How a refused SFT row is worded: the field at fault as a path, values quoted short, one line each.

Also the checks that run before validation because a later stage would crash on them: nesting deeper than
`MAX_DEPTH` and strings holding a lone UTF-16 surrogate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from loops_nb.validation_message import extend_path, json_type, problems, show

# Deeper rows are refused before validation. Without a bound, JSON nested a few thousand levels deep raises
# RecursionError in json.loads, and a few hundred levels inside tool arguments passes validation but makes pydantic's
# serializer (and Jinja's tojson) fail mid-render. 100 levels leaves ample room for real tool argument schemas.
MAX_DEPTH = 100

_KIND_WORDS = {"missing": "required field missing", "extra_forbidden": "unknown field"}
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
    problem = problems(exc)[0]
    path = _cut(problem.path)
    msg = _KIND_WORDS.get(problem.kind, problem.message)
    if problem.kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[problem.kind]}, got {json_type(problem.given)}"
    if not path:  # a model-level check names its field in the message
        return msg
    return f"{path}{msg}" if msg.startswith("[") else f"{path}: {msg}"


def unreadable(obj: object, root: str = "the row") -> str | None:
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
                stack.append((item, extend_path(path, key), depth + 1))
    return None


def _cut(path: str, limit: int = 80) -> str:
    return path if len(path) <= limit else f"{path[:limit]}..."


LENGTH_FIX = (
    "raise [model] max_seq_len (up to the model's context length) or split the conversation into shorter rows"
)
"""What to do about an over-long row; the refusal says it (the renderer appends it to the reason)."""
FIRST_TOKEN = (
    "the first token can never train (its loss needs a token before it); put the context it follows before it"
)
"""Why a row whose only weighted token is its first cannot train, and what to do (data.py and targets.py say it)."""

# What to do about each kind of refusal, by a pattern of its reason (first match wins). A reason that already
# ends in its fix (``...; save the file as UTF-8``) matches an entry holding that same text, so `with_fix`
# never says it twice; a pattern starting "!" marks a reason that says it in other words.
_FIXES: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(pattern.removeprefix("!")), fix, pattern.startswith("!"))
    for pattern, fix in (
        (r"^not UTF-8 text", "save the file as UTF-8"),
        (r"^invalid JSON", "make the line one JSON object (JSONL holds one row per line)"),
        (r"nested more than \d+ levels deep", "flatten the row (or its tool arguments) to fewer levels"),
        (r"lone surrogate", "fix the program that wrote the file"),
        (
            r"^a row must be a JSON object|^the row has neither",
            'write the row as {"messages": [...]} (chat) or {"input_ids": [...], "weights": [...]} (tokenized)',
        ),
        (r"^the row mixes the chat format", "use one format per row: messages, or input_ids and weights"),
        (r"longer than max_seq_len", LENGTH_FIX),
        (r"first token can never train", "put the context it follows before it"),
        (r"outside the tokenizer's vocabulary", "tokenize the row with this model's tokenizer"),
        (r"^input_ids: empty|^weights: all zero", "give the tokens to learn a weight > 0"),
        (r"^weights: \d+ weights for", "give exactly one weight per input id"),
        (r"must be a token id", "write token ids as integers >= 0"),
        (r"must be a finite number >= 0", "write weights as numbers >= 0"),
        (r": unknown field$", "remove or rename the field (docs/reference/sft.md lists the fields)"),
        (r": required field missing$", "add the field"),
        (r"!unknown role .*; expected one of", "use one of the roles system, user, assistant, tool"),
        (
            r"only text and image parts|must be exactly \{'type': 'text'",
            "send text parts and image_url parts",
        ),
        (
            r"an image part needs its URL",
            "give the image as {'type': 'image_url', 'image_url': {'url': ...}}",
        ),
        (r"only user turns hold images", "move the image to a user turn"),
        (
            r"train only through a family's image renderer",
            "remove the images, or train a model of such a family",
        ),
        (r"^messages: empty|no assistant turn", "add the assistant turn the model should learn"),
        (r"every assistant turn has weight 0", "give the turns to learn weight 1, or remove the row"),
        (r"empty assistant turn", "give the turn content or tool_calls, or remove it"),
        (r"only assistant turns take a weight", "remove the weight (only assistant turns train)"),
        (r"\.weight: must be 0 or 1", "set the weight to 0 (context only) or 1 (trains)"),
        (r"is not one of the row's tools", "add the tool to the row's tools, or fix the call's name"),
        (r"\.arguments: ", "give the arguments as a JSON object (or a string holding one)"),
        (
            r"matches no earlier assistant tool call|needs the id of the call it answers",
            "set tool_call_id to the id of the assistant tool call it answers",
        ),
        (r"only assistant turns (make tool calls|carry reasoning)", "move it to an assistant turn"),
        (r"only tool messages answer a tool call", "remove the tool_call_id"),
        (r"needs content", "add the content"),
        (r"is defined twice", "define each tool once"),
        (r"contains the special token", "remove the control token from the text: the template writes them"),
        (r"add the turn it answers, or give it weight 0", "add the turn it answers, or give it weight 0"),
        (
            r"chat template failed to render",
            "change the row to what the template accepts (e.g. alternate user and assistant turns), or set "
            "[model] chat_template",
        ),
        # A family renderer's (`renderers`) reasons say their fix themselves (survival.family_wording).
        (r"!renderer dropped this", "set [model] renderer_options, or [model] renderer"),
        (
            r"!renderer (failed to render|writes this turn unlike|ends this turn with no stop token)",
            'set [model] renderer to another family, or to "chat_template"',
        ),
        (r"dropped this tool", 'set [model] chat_template to a tool-capable template (e.g. "chatml-tools")'),
        (r"dropped this text", "set [model] chat_template to a template that renders this text"),
        (
            r"generation prompt does not match",
            "set [model] chat_template to one whose generation prompt opens its turns as they are rendered",
        ),
        (r"has no stop token", "set [model] chat_template to one that ends each turn with a stop token"),
        (r"must be (a|an|true|the) |should be|should have", "give the field the type or value named"),
    )
)
FALLBACK_FIX = "fix or remove the row (docs/reference/sft.md#refusal-reasons lists every reason)"
_FIELD = re.compile(r"^([A-Za-z_][\w.]*(?:\[[^\]\s]*\][\w.]*)*): ")


def _entry(reason: str) -> tuple[str, bool]:
    return next(
        ((fix, said) for pattern, fix, said in _FIXES if pattern.search(reason)), (FALLBACK_FIX, False)
    )


def remedy(reason: str) -> str:
    """What to do about a refused row, from its reason."""
    return _entry(reason)[0]


def with_fix(reason: str) -> str:
    """The reason, ending in what to do (once: a reason that already says it is kept as it is)."""
    fix, said = _entry(reason)
    return reason if said or fix in reason else f"{reason}; {fix}"


def refused_field(reason: str) -> str | None:
    """The field a reason names first (``messages[2].weight``), or None for a row-level reason."""
    found = _FIELD.match(reason)
    return found.group(1) if found else None
