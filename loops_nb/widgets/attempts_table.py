"""RL attempts with their transcripts one click away: `AttemptsTable`, live, a page of a finished run, or one
trained step's attempts (`AttemptsLog`).

Reading transcripts is the check that numbers cannot replace: a reward that rises because the model found a
loophole looks like learning on every chart. Each row is a ``<details>`` element whose body is the transcript:
it opens without JavaScript, and uses only what JupyterLab's sanitizer keeps in an untrusted notebook
(docs/reference/notebook_widgets.md, "Saved and reopened notebooks").

Whether an attempt trained is known only after its step trained: ``on_attempt`` rows say "pending" until the
step's rollouts.jsonl rows fill in ``trained``, ``step`` and ``group`` (`merge_rollout`). Steps are numbered
from 1, as in the panel.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any, cast

from loops_nb.errors import UserError
from loops_nb.run_dir import JsonlLog
from loops_nb.run_events import AttemptFinished, AttemptRow, StepRollouts
from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import GREY, MONOSPACE, div, fmt, heading, plural, tag

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


SORTS = {"step": "step", "reward": "reward", "tokens": "sampled_tokens", "time": "seconds"}
STATUSES = ("trained", "not_trained", "discarded", "kept")


class AttemptsTable(Widget):
    """The last ``max_rows`` attempts (newest first), with their transcripts folded under each row.

    A run observer: ``on_attempt`` takes an attempt as `RLRun` emits it, ``on_rollouts`` the step's
    rollouts.jsonl rows (trained, step, group). `from_run` and `page` give rows in their own order instead."""

    def __init__(self, *, max_rows: int = 50, max_chars: int = 4000, anchor: str | None = None) -> None:
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.anchor = anchor  # an HTML id, so that a health panel can link here
        self.rows: deque[AttemptRow] = deque(maxlen=max_rows)
        self.seen = 0
        self.discarded = 0
        self.reward_sum = 0.0
        self.rewarded = 0
        self.caption: str | None = None  # a page (`page`): what it shows, in the given order
        self.tail = self.style = ""  # a page's HTML after the rows, and its extra CSS

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        *,
        sort: str = "step",
        descending: bool | None = None,
        status: str | None = None,
        page: int = 1,
        page_size: int = 50,
        max_chars: int = 4000,
    ) -> AttemptsTable:
        """One page of every attempt a run recorded in rollouts.jsonl, with transcripts when they were kept (the
        options: docs/reference/notebook_widgets.md, "Every attempt of a run")."""
        root = Path(run_dir)
        path = root / "rollouts.jsonl"
        if not path.is_file():
            raise UserError(f"{path} does not exist: pass the directory of an RL run (runs/<name>)")
        if sort not in SORTS:
            raise UserError(f"sort={sort!r}: sort by one of {', '.join(SORTS)}")
        if status is not None and status not in STATUSES:
            raise UserError(f"status={status!r}: filter by one of {', '.join(STATUSES)}")
        # A line torn by a crash mid-write is skipped, as the run skips it on resume.
        rows = [
            cast(AttemptRow, r) for r in JsonlLog(path).records() if status is None or _has_status(r, status)
        ]
        key = SORTS[sort]
        down = sort != "step" if descending is None else descending
        known = [r for r in rows if isinstance(r.get(key), int | float)]
        rows = sorted(known, key=lambda r: cast(float, r.get(key)), reverse=down) + [
            r for r in rows if r not in known
        ]
        pages = max(1, math.ceil(len(rows) / page_size))
        if not 1 <= page <= pages:
            raise UserError(f"page={page}: {path} has {pages} page{'s' if pages != 1 else ''} of {page_size}")
        shown = rows[(page - 1) * page_size : page * page_size]
        _attach_transcripts(root, shown)
        first = (page - 1) * page_size + 1
        order = f"sorted by {sort}" + (" (highest first)" if down else "")
        which = f" {status.replace('_', ' ')}" if status else ""
        caption = (
            f"{root.name}: attempts {first:,}–{first + len(shown) - 1:,} of {len(rows):,}{which}, {order}"
            f" · page {page} of {pages}"
            + (f"; AttemptsTable.from_run(..., page={page + 1}) for the next" if page < pages else "")
        )
        return cls.page(shown, caption, max_chars=max_chars)

    @classmethod
    def page(
        cls, rows: list[AttemptRow], caption: str, *, max_chars: int, tail: str = "", style: str = ""
    ) -> AttemptsTable:
        """``rows`` in their given order under ``caption``: a page of a run, or one step's attempts."""
        table = cls(max_rows=max(len(rows), 1), max_chars=max_chars)
        for r in rows:
            table.add(r)
        table.caption, table.tail, table.style = caption, tail, style
        return table

    def on_attempt(self, attempt: AttemptFinished) -> None:
        """Take an attempt as it finishes (reward, discarded, detail, text.calls, ...)."""
        self.add(cast(AttemptRow, attempt.to_json()))

    def add(self, row: AttemptRow) -> None:
        """Take an attempt's row: an `AttemptFinished`'s line, or a rollouts.jsonl row."""
        self.rows.append(row)
        self.seen += 1
        if row.get("discarded"):
            self.discarded += 1
        elif isinstance(reward := row.get("reward"), int | float):
            self.reward_sum += reward
            self.rewarded += 1

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        """Fill in ``trained``, ``step`` and ``group`` from a step's rollouts.jsonl rows."""
        by_id = {r.get("attempt"): r for r in rollouts.rows}
        for row in self.rows:
            known = by_id.get(row.get("attempt"))
            if known is not None:
                merge_rollout(row, known)

    def summary(self) -> str:
        if self.caption is not None:
            return self.caption
        if not self.seen:
            return "attempts: none yet"
        shown = f", the last {len(self.rows)} shown" if len(self.rows) < self.seen else ""
        mean = fmt(self.reward_sum / self.rewarded if self.rewarded else None, 3)
        return f"{plural(self.seen, 'attempt')}{shown}: mean reward {mean}, {self.discarded:,} discarded"

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.rows:
            lines.append(text_table(self._ordered() if self.caption is not None else self._ordered()[:10]))
        return "\n".join(lines)

    def to_html(self) -> str:
        paged = self.caption is not None
        note = "click a row for its transcript" if paged else "newest first; click a row for its transcript"
        anchor = f' id="{escape(self.anchor)}"' if self.anchor else ""
        head = "".join(_cell(name, name, width, "#374151;font-weight:600") for name, width in COLUMNS)
        head = div(head, "padding-left:14px;border-bottom:1px solid #9ca3af;white-space:nowrap")
        rows = "".join(row_html(r, max_chars=self.max_chars) for r in self._ordered())
        body = heading(self.summary(), note) + head + rows + self.tail
        return f'<div{anchor} style="{MONO};color:#1f2328{self.style}">{body}</div>'

    def _ordered(self) -> list[AttemptRow]:
        """A page of a run in its given order; a live table newest first."""
        return list(self.rows) if self.caption is not None else list(self.rows)[::-1]


def _has_status(r: Mapping[str, object], status: str) -> bool:
    if status == "discarded":
        return bool(r.get("discarded"))
    if status == "kept":
        return not r.get("discarded")
    return not r.get("discarded") and bool(r.get("trained")) == (status == "trained")


def _attach_transcripts(root: Path, rows: list[AttemptRow]) -> None:
    """Each row's transcript from transcripts/step-NNNNNN.json, read once per step."""
    by_step: dict[int | None, dict[object, Mapping[str, Any]]] = {}
    for step in {s for r in rows if isinstance(s := r.get("step"), int)}:
        path = root / "transcripts" / f"step-{step:06d}.json"
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        by_step[step] = {e.get("attempt"): e for e in entries if isinstance(e, dict)}
    for r in rows:
        entry = by_step.get(r.get("step"), {}).get(r.get("attempt"))
        if entry is not None:
            r["text"] = entry
