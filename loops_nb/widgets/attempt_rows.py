"""One RL attempt as a row: `AttemptRow`, and its renderers, shared by `AttemptsTable` and `AttemptsLog`.

Each row is a ``<details>`` element whose ``<summary>`` is the row and whose body is the transcript: it opens
without JavaScript and works in a saved, untrusted notebook. The layout uses only what JupyterLab's sanitizer
keeps in untrusted notebooks (every papermill output): cells are inline-block ``<span>``s sized in ``em`` (the
sanitizer drops ``ch``, which once ran every column together), each with its full text in ``title`` for hover.

Whether an attempt trained is known only after its step trained: ``on_attempt`` rows say "pending" until the
step's rollouts.jsonl rows fill in ``trained``, ``step`` and ``group`` (`merge_rollout`). Steps are numbered
from 1, as in the panel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any, cast

from loops_nb.run_events import AttemptRow
from loops_nb.widgets.style import GREY, MONOSPACE, div, fmt, heading, tag

MONO = f"font:12px/1.45 {MONOSPACE}"
# (name, width in characters): rendered as em at 0.62em per monospace character.
COLUMNS = (
    ("step", 5),
    ("group", 5),
    ("attempt", 8),
    ("task", 20),
    ("reward", 8),
    ("status", 20),
    ("policy", 7),
    ("calls", 5),
    ("tokens", 7),
    ("secs", 6),
)
_EM_PER_CHAR = 0.62
_LABEL = "color:#57606a"
_PRE = (
    "white-space:pre-wrap;overflow-wrap:break-word;margin:2px 0 6px;padding:4px 6px;border-radius:4px;"
    "max-height:360px;overflow-y:auto"
)


def merge_rollout(row: AttemptRow, rollout: Mapping[str, Any]) -> None:
    """Copy what only the trained step knows (step, group, trained) onto an ``on_attempt`` row."""
    row.update(
        cast(AttemptRow, {k: rollout[k] for k in ("step", "group", "slot", "trained") if k in rollout})
    )
    text = row.get("text")
    if isinstance(text, Mapping) and isinstance(text.get("calls"), list) and "trained" in rollout:
        row["text"] = {**text, "calls": [{**c, "trained": rollout["trained"]} for c in text["calls"]]}


def cells(r: AttemptRow) -> list[tuple[str, str]]:
    """One attempt's (shown text, hover text) per column."""
    versions = [v for v in r.get("policy_versions") or [] if isinstance(v, int)]
    lo, hi = (min(versions), max(versions)) if versions else (None, None)
    policy = "-" if lo is None else f"v{lo}" if lo == hi else f"v{lo}-{hi}"
    attempt, task = str(r.get("attempt", "")), str(r.get("task", ""))
    step, group, status = r.get("step"), r.get("group"), status_text(r)
    shown_step = str(step + 1) if isinstance(step, int) else "-"
    in_file = f" (step {step} in rollouts.jsonl)" if isinstance(step, int) else ""
    return [
        (shown_step, f"step {shown_step}{in_file}"),
        ("-", "group unknown") if group is None else (f"g{group}", f"group {group}"),
        (attempt.rsplit("/", 1)[-1], attempt),
        (task, task),
        (fmt(r.get("reward"), 3), f"reward {r.get('reward')}"),
        (status, status + (f": {r['detail']}" if r.get("detail") else "")),
        (policy, "sampled by policy " + policy),
        (str(r.get("calls", "")), "model calls"),
        (fmt(r.get("sampled_tokens")), "sampled tokens"),
        (fmt(r.get("seconds"), 3), "seconds"),
    ]


def trained_flag(r: AttemptRow) -> bool | None:
    """Whether the attempt trained: the row's flag (from its step's rollouts), else its calls' flags when every
    call has one (a hand-fed record), else None (its step has not trained yet)."""
    if r.get("trained") is not None:
        return bool(r["trained"])
    text = r.get("text")
    calls = (text.get("calls") if isinstance(text, Mapping) else None) or []
    flags = [c.get("trained") for c in calls if isinstance(c, Mapping)]
    if flags and all(f is not None for f in flags):
        return any(flags)
    return None


def status_text(r: AttemptRow) -> str:
    if r.get("discarded"):
        return f"discarded: {r['discarded']}"
    trained = trained_flag(r)
    if trained is None:
        return "ok · pending"  # its step has not trained yet
    return "ok · trained" if trained else "ok · not trained"


def _status_colour(r: AttemptRow) -> str:
    if r.get("discarded"):
        return "#b91c1c"
    if trained_flag(r):
        return "#1a7f37"
    return "#57606a"


def text_table(rows: Iterable[AttemptRow]) -> str:
    lines = ["  ".join(name.ljust(width) for name, width in COLUMNS).rstrip()]
    for r in rows:
        lines.append(
            "  ".join(
                _ellipsis(text, width).ljust(width)
                for (text, _), (_, width) in zip(cells(r), COLUMNS, strict=True)
            ).rstrip()
        )
    return "\n".join(lines)


def attempts_html(
    title: str,
    note: str,
    rows: Iterable[AttemptRow],
    max_chars: int,
    *,
    anchor: str = "",
    style: str = "",
    tail: str = "",
) -> str:
    """A title line with a grey ``note``, then the rows (`AttemptsTable`, and each step of `AttemptsLog`)."""
    body = heading(title, note) + rows_html(rows, max_chars=max_chars) + tail
    return f'<div{anchor} style="{MONO};color:#1f2328{style}">{body}</div>'


def rows_html(rows: Iterable[AttemptRow], *, max_chars: int = 4000) -> str:
    """The header and one ``<details>`` per attempt, transcript inside (sanitizer-proof)."""
    head = "".join(_cell(name, name, width, "#374151;font-weight:600") for name, width in COLUMNS)
    head = div(head, "padding-left:14px;border-bottom:1px solid #9ca3af;white-space:nowrap")
    return head + "".join(row_html(r, max_chars=max_chars) for r in rows)


def row_html(r: AttemptRow, *, max_chars: int = 4000) -> str:
    status_colour = _status_colour(r)
    row = "".join(
        _cell(text, hover, width, status_colour if name == "status" else "#1f2328")
        for (text, hover), (name, width) in zip(cells(r), COLUMNS, strict=True)
    )
    summary = tag("summary", row, "cursor:pointer;white-space:nowrap;border-bottom:1px solid #f3f4f6")
    return tag("details", summary + div(transcript_html(r, max_chars), "padding:4px 0 8px 14px"))


def transcript_html(r: AttemptRow, max_chars: int) -> str:
    parts = [div(f"attempt {escape(str(r.get('attempt', '')))}", _LABEL)]
    if r.get("detail"):
        parts.append(div(f"detail: {escape(_clip(str(r['detail']), 500))}", _LABEL))
    text = r.get("text")
    calls = (text.get("calls") if isinstance(text, Mapping) else None) or []
    if not calls:
        parts.append(
            div('no transcript recorded (output.trace = "full" keeps one per attempt)', f"color:{GREY}")
        )
    for n, call in enumerate(calls, 1):
        trained = call.get("trained", r.get("trained"))
        finish = call.get("finish_reason") or "-"
        state = {True: "trained", False: "not trained", None: "training pending"}.get(trained, "not trained")
        label = f"call {n}/{len(calls)} · finish {finish} · {state}"
        prompt = escape(_clip(str(call.get("prompt", "")), max_chars, keep="end"))
        bg = "rgba(46,160,67,0.18)" if trained is True else "#f6f8fa"
        parts.append(div(escape(label), f"{_LABEL};margin-top:4px"))
        parts.append(tag("div", prompt, f"{_PRE};background:#f6f8fa;color:#57606a", "prompt"))
        parts.append(
            tag(
                "div",
                escape(_clip(str(call.get("completion", "")), max_chars)),
                f"{_PRE};background:{bg}",
                "completion",
            )
        )
        if call.get("tool_calls"):
            parts.append(div(f"tool calls: {escape(_clip(str(call['tool_calls']), 1000))}", _LABEL))
    return "".join(parts)


def _cell(text: str, hover: str, width: int, colour: str) -> str:
    em = f"{width * _EM_PER_CHAR + 0.6:.2f}em"  # + a gap between columns
    style = f"display:inline-block;width:{em};overflow:hidden;text-overflow:ellipsis;white-space:nowrap"
    return tag("span", escape(text), f"{style};vertical-align:top;color:{colour}", hover)


def _ellipsis(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _clip(text: str, limit: int, *, keep: str = "start") -> str:
    """At most ``limit`` characters; prompts keep their end (the latest turn), completions their start."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if keep == "end":
        return f"… {cut:,} earlier characters …\n" + text[-limit:]
    return text[:limit] + f"\n… {cut:,} more characters"
