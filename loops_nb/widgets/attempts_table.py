"""The recent attempts of an RL run, each with its transcript one click away.

Reading transcripts is the check that numbers cannot replace: a reward that rises because the model found a
loophole looks like learning on every chart. The table keeps the last ``max_rows`` attempt records (bounded: a
run makes thousands) with reward, discard reason, policy versions and tokens. Each row is a ``<details>`` element
whose ``<summary>`` is the row and whose body is the transcript: it opens without JavaScript and still works in a
saved, untrusted notebook. Long texts are cut to ``max_chars`` so that a live panel re-rendered twice a second
stays small.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from html import escape
from typing import Any

from loops_nb.widgets.environment import LiveDisplay
from loops_nb.widgets.svg_chart import fmt

_MONO = "font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"
_COLUMNS = (
    ("#", 6),
    ("task", 18),
    ("reward", 8),
    ("status", 22),
    ("policy", 8),
    ("calls", 6),
    ("tokens", 8),
    ("secs", 7),
)
_PRE = (
    "white-space:pre-wrap;word-break:break-word;margin:2px 0 6px;padding:4px 6px;border-radius:4px;"
    "max-height:360px;overflow-y:auto"
)


class AttemptsTable:
    """The last ``max_rows`` attempts (newest first), with their transcripts folded under each row."""

    def __init__(self, *, max_rows: int = 50, max_chars: int = 4000, anchor: str | None = None) -> None:
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.anchor = anchor  # an HTML id, so that a health panel can link here
        self.rows: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self.seen = 0
        self.discarded = 0
        self.reward_sum = 0.0
        self.rewarded = 0

    def on_attempt(self, record: Mapping[str, Any]) -> None:
        """Take an attempt record (as `RLRun` emits it: reward, discarded, detail, text.calls, ...)."""
        self.rows.append(dict(record))
        self.seen += 1
        if record.get("discarded"):
            self.discarded += 1
        elif isinstance(record.get("reward"), int | float):
            self.reward_sum += float(record["reward"])
            self.rewarded += 1

    add = on_attempt

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def summary(self) -> str:
        if not self.seen:
            return "AttemptsTable(no attempts yet)"
        return (
            f"AttemptsTable({len(self.rows)} of {self.seen} attempts, mean reward {fmt(self.mean_reward, 3)}, "
            f"{self.discarded} discarded)"
        )

    __repr__ = summary

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.rows:
            lines.append("  ".join(name.ljust(width) for name, width in _COLUMNS))
            lines.extend(
                "  ".join(
                    cell[:width].ljust(width)
                    for cell, (_, width) in zip(self._cells(r), _COLUMNS, strict=True)
                ).rstrip()
                for r in list(self.rows)[::-1][:10]
            )
        return "\n".join(lines)

    def _cells(self, r: Mapping[str, Any]) -> list[str]:
        versions = [v for v in r.get("policy_versions") or [] if isinstance(v, int)]
        policy = "-"
        if versions:
            lo, hi = min(versions), max(versions)
            policy = f"v{lo}" if lo == hi else f"v{lo}-{hi}"
        return [
            str(r.get("attempt", "")),
            str(r.get("task", "")),
            fmt(r.get("reward"), 3),
            _status(r),
            policy,
            str(r.get("calls", "")),
            fmt(r.get("sampled_tokens")),
            fmt(r.get("seconds"), 3),
        ]

    def to_html(self) -> str:
        anchor = f' id="{escape(self.anchor)}"' if self.anchor else ""
        head = "".join(_cell(name, width, "#374151;font-weight:600") for name, width in _COLUMNS)
        out = [
            f'<div{anchor} style="{_MONO};color:#1f2328">',
            f'<div style="font:600 12px system-ui,sans-serif;margin:2px 0">{escape(self.summary())}'
            f'<span style="font-weight:400;color:#6b7280"> · newest first; click a row for its transcript'
            f"</span></div>",
            f'<div style="padding-left:14px;border-bottom:1px solid #9ca3af">{head}</div>',
        ]
        for r in list(self.rows)[::-1]:
            out.append(self._row_html(r))
        out.append("</div>")
        return "".join(out)

    def _row_html(self, r: Mapping[str, Any]) -> str:
        discarded = bool(r.get("discarded"))
        colour = "#b91c1c" if discarded else "#1f2328"
        cells = "".join(
            _cell(text, width, colour if name == "status" else "#1f2328")
            for text, (name, width) in zip(self._cells(r), _COLUMNS, strict=True)
        )
        summary = f'<summary style="cursor:pointer;border-bottom:1px solid #f3f4f6">{cells}</summary>'
        return f'<details>{summary}<div style="padding:4px 0 8px 14px">{self._transcript(r)}</div></details>'

    def _transcript(self, r: Mapping[str, Any]) -> str:
        parts = []
        if r.get("detail"):
            parts.append(f'<div style="color:#57606a">detail: {escape(_clip(str(r["detail"]), 500))}</div>')
        text = r.get("text")
        calls = (text.get("calls") if isinstance(text, Mapping) else None) or []
        if not calls:
            parts.append(
                '<div style="color:#6b7280">no transcript recorded (output.trace = "full" keeps '
                "one per attempt)</div>"
            )
        for n, call in enumerate(calls, 1):
            trained = call.get("trained")
            finish = call.get("finish_reason") or "-"
            label = f"call {n}/{len(calls)} · finish {finish}" + (
                " · trained" if trained else " · not trained"
            )
            parts.append(f'<div style="color:#57606a;margin-top:4px">{escape(label)}</div>')
            parts.append(
                f'<div style="{_PRE};background:#f6f8fa;color:#57606a" title="prompt">'
                f"{escape(_clip(str(call.get('prompt', '')), self.max_chars, keep='end'))}</div>"
            )
            bg = "rgba(46,160,67,0.18)" if trained else "#f6f8fa"
            parts.append(
                f'<div style="{_PRE};background:{bg}" title="completion">'
                f"{escape(_clip(str(call.get('completion', '')), self.max_chars))}</div>"
            )
            if call.get("tool_calls"):
                parts.append(
                    f'<div style="color:#57606a">tool calls: '
                    f"{escape(_clip(str(call['tool_calls']), 1000))}</div>"
                )
        return "".join(parts)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.summary(), "text/html": self.to_html()}

    def show(self, **kwargs: Any) -> LiveDisplay:
        return LiveDisplay(self, **kwargs).show()


def _status(r: Mapping[str, Any]) -> str:
    if r.get("discarded"):
        return f"discarded: {r['discarded']}"
    return "ok"


def _cell(text: str, width: int, colour: str) -> str:
    return (
        f'<span title="{escape(text)}" style="display:inline-block;width:{width + 1}ch;overflow:hidden;'
        f'text-overflow:ellipsis;white-space:nowrap;vertical-align:top;color:{colour}">{escape(text)}</span>'
    )


def _clip(text: str, limit: int, *, keep: str = "start") -> str:
    """At most ``limit`` characters; prompts keep their end (the latest turn), completions their start."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if keep == "end":
        return f"… {cut:,} earlier characters …\n" + text[-limit:]
    return text[:limit] + f"\n… {cut:,} more characters"
