"""RL attempts with their transcripts one click away: `AttemptsTable` and the row renderer `LiveRun` shares.

Reading transcripts is the check that numbers cannot replace: a reward that rises because the model found a
loophole looks like learning on every chart. The table keeps the last ``max_rows`` attempt records (bounded: a
run makes thousands) with step, group, reward, status (discarded, trained or not), policy versions and tokens.
Each row is a ``<details>`` element whose ``<summary>`` is the row and whose body is the transcript: it opens
without JavaScript and works in a saved, untrusted notebook.

The layout uses only what JupyterLab's sanitizer keeps in untrusted notebooks (every papermill output): cells
are inline-block ``<span>``s sized in ``em`` (the sanitizer drops ``ch``, which once ran every column
together), each with its full text in ``title`` for hover. Whether an attempt trained is known only after its
step's advantages are computed: ``on_attempt`` rows say "pending" until the step's ``on_rollouts`` event (the
rows rollouts.jsonl gets) fills in ``trained``, ``step`` and ``group``. Steps are numbered from 1, as the CLI and
the rest of the panel number them (``step`` in rollouts.jsonl counts from 0).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any, TypedDict, cast

from loops_nb.errors import UserError
from loops_nb.run_events import AttemptFinished, StepRollouts
from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import fmt

MONO = "font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"
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
_PRE = (
    "white-space:pre-wrap;overflow-wrap:break-word;margin:2px 0 6px;padding:4px 6px;border-radius:4px;"
    "max-height:360px;overflow-y:auto"
)


class AttemptRow(TypedDict, total=False):
    """An attempt as the tables read it: an `AttemptFinished`'s line, a rollouts.jsonl row (whose format is the
    run's, not this type's: keys not named here are kept as read), or the one merged into the other."""

    step: int | None  # 0-based, as in rollouts.jsonl
    slot: int
    group: int
    task: str
    attempt: str
    reward: float | None
    trained: bool | None
    discarded: str | None
    detail: str
    policy_versions: list[int]
    calls: int
    sampled_tokens: int
    seconds: float
    text: Mapping[str, Any]  # the transcript entry: ``text["calls"][i]["completion"]``, ...


SORTS = {"step": "step", "reward": "reward", "tokens": "sampled_tokens", "time": "seconds"}
STATUSES = ("trained", "not_trained", "discarded", "kept")


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


class AttemptsTable(Widget):
    """The last ``max_rows`` attempts (newest first), with their transcripts folded under each row.

    A run observer: ``on_attempt`` takes an attempt as `RLRun` emits it, ``on_rollouts`` the step's
    rollouts.jsonl rows (trained, step, group)."""

    def __init__(self, *, max_rows: int = 50, max_chars: int = 4000, anchor: str | None = None) -> None:
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.anchor = anchor  # an HTML id, so that a health panel can link here
        self.rows: deque[AttemptRow] = deque(maxlen=max_rows)
        self.seen = 0
        self.discarded = 0
        self.reward_sum = 0.0
        self.rewarded = 0
        self.caption: str | None = None  # a page of a run (`from_run`): what it shows, in the given order

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
        """One page of every attempt a run recorded in rollouts.jsonl, with transcripts from transcripts/ when
        ``[output] trace = "full"`` kept them. ``sort``: step, reward, tokens or time (``descending``: highest
        first; by default for all but step); ``status``: trained, not_trained, discarded or kept (not
        discarded); ``page`` counts from 1."""
        root = Path(run_dir)
        path = root / "rollouts.jsonl"
        if not path.is_file():
            raise UserError(f"{path} does not exist: pass the directory of an RL run (runs/<name>)")
        if sort not in SORTS:
            raise UserError(f"sort={sort!r}: sort by one of {', '.join(SORTS)}")
        if status is not None and status not in STATUSES:
            raise UserError(f"status={status!r}: filter by one of {', '.join(STATUSES)}")
        rows = [r for r in _read_jsonl(path) if status is None or _has_status(r, status)]
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
        table = cls(max_rows=max(len(shown), 1), max_chars=max_chars)
        for r in shown:
            table.add(r)
        first = (page - 1) * page_size + 1
        order = f"sorted by {sort}" + (" (highest first)" if down else "")
        which = f" {status.replace('_', ' ')}" if status else ""
        table.caption = (
            f"{root.name}: attempts {first:,}–{first + len(shown) - 1:,} of {len(rows):,}{which}, {order}"
            f" · page {page} of {pages}"
            + (f"; AttemptsTable.from_run(..., page={page + 1}) for the next" if page < pages else "")
        )
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

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def summary(self) -> str:
        if self.caption is not None:
            return self.caption
        if not self.seen:
            return "attempts: none yet"
        shown = f", the last {len(self.rows)} shown" if len(self.rows) < self.seen else ""
        return (
            f"{plural(self.seen, 'attempt')}{shown}: mean reward {fmt(self.mean_reward, 3)}, "
            f"{self.discarded:,} discarded"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.rows:
            rows = list(self.rows) if self.caption is not None else list(self.rows)[::-1][:10]
            lines.append(text_table(rows))
        return "\n".join(lines)

    def to_html(self) -> str:
        paged = self.caption is not None
        note = "click a row for its transcript" if paged else "newest first; click a row for its transcript"
        rows = list(self.rows) if paged else list(self.rows)[::-1]
        anchor = f' id="{escape(self.anchor)}"' if self.anchor else ""
        return attempts_html(self.summary(), note, rows, self.max_chars, anchor=anchor)


def _read_jsonl(path: Path) -> list[AttemptRow]:
    out: list[AttemptRow] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a crash mid-write: the run skips it on resume too
            continue
        if isinstance(record, dict):
            out.append(cast(AttemptRow, record))
    return out


def _has_status(r: AttemptRow, status: str) -> bool:
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
    policy = "-"
    if versions:
        lo, hi = min(versions), max(versions)
        policy = f"v{lo}" if lo == hi else f"v{lo}-{hi}"
    attempt = str(r.get("attempt", ""))
    short = attempt.rsplit("/", 1)[-1] if "/" in attempt else attempt
    step = r.get("step")
    shown_step = str(step + 1) if isinstance(step, int) else "-"
    group = r.get("group")
    status = status_text(r)
    out = [
        (
            shown_step,
            f"step {shown_step}" + (f" (step {step} in rollouts.jsonl)" if isinstance(step, int) else ""),
        ),
        (
            f"g{group}" if group is not None else "-",
            f"group {group}" if group is not None else "group unknown",
        ),
        (short, attempt),
        (str(r.get("task", "")), str(r.get("task", ""))),
        (fmt(r.get("reward"), 3), f"reward {r.get('reward')}"),
        (status, status + (f": {r['detail']}" if r.get("detail") else "")),
        (policy, "sampled by policy " + policy),
        (str(r.get("calls", "")), "model calls"),
        (fmt(r.get("sampled_tokens")), "sampled tokens"),
        (fmt(r.get("seconds"), 3), "seconds"),
    ]
    return out


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
    return (
        f'<div{anchor} style="{MONO};color:#1f2328{style}">'
        f'<div style="font:600 12px system-ui,sans-serif;margin:2px 0">{escape(title)}'
        f'<span style="font-weight:400;color:#6b7280"> · {note}</span></div>'
        f"{rows_html(rows, max_chars=max_chars)}{tail}</div>"
    )


def rows_html(rows: Iterable[AttemptRow], *, max_chars: int = 4000) -> str:
    """The header and one ``<details>`` per attempt, transcript inside (sanitizer-proof)."""
    head = "".join(_cell(name, name, width, "#374151;font-weight:600") for name, width in COLUMNS)
    out = [f'<div style="padding-left:14px;border-bottom:1px solid #9ca3af;white-space:nowrap">{head}</div>']
    out.extend(row_html(r, max_chars=max_chars) for r in rows)
    return "".join(out)


def row_html(r: AttemptRow, *, max_chars: int = 4000) -> str:
    status_colour = _status_colour(r)
    row = "".join(
        _cell(text, hover, width, status_colour if name == "status" else "#1f2328")
        for (text, hover), (name, width) in zip(cells(r), COLUMNS, strict=True)
    )
    summary = (
        f'<summary style="cursor:pointer;white-space:nowrap;border-bottom:1px solid #f3f4f6">{row}</summary>'
    )
    return f'<details>{summary}<div style="padding:4px 0 8px 14px">{transcript_html(r, max_chars)}</div></details>'


def transcript_html(r: AttemptRow, max_chars: int) -> str:
    parts = []
    parts.append(f'<div style="color:#57606a">attempt {escape(str(r.get("attempt", "")))}</div>')
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
        trained = call.get("trained", r.get("trained"))
        finish = call.get("finish_reason") or "-"
        state = {True: "trained", False: "not trained", None: "training pending"}.get(trained, "not trained")
        label = f"call {n}/{len(calls)} · finish {finish} · {state}"
        parts.append(f'<div style="color:#57606a;margin-top:4px">{escape(label)}</div>')
        parts.append(
            f'<div style="{_PRE};background:#f6f8fa;color:#57606a" title="prompt">'
            f"{escape(_clip(str(call.get('prompt', '')), max_chars, keep='end'))}</div>"
        )
        bg = "rgba(46,160,67,0.18)" if trained is True else "#f6f8fa"
        parts.append(
            f'<div style="{_PRE};background:{bg}" title="completion">'
            f"{escape(_clip(str(call.get('completion', '')), max_chars))}</div>"
        )
        if call.get("tool_calls"):
            parts.append(
                f'<div style="color:#57606a">tool calls: {escape(_clip(str(call["tool_calls"]), 1000))}</div>'
            )
    return "".join(parts)


def _cell(text: str, hover: str, width: int, colour: str) -> str:
    em = f"{width * _EM_PER_CHAR + 0.6:.2f}em"  # + a gap between columns
    return (
        f'<span title="{escape(hover)}" style="display:inline-block;width:{em};overflow:hidden;'
        f'text-overflow:ellipsis;white-space:nowrap;vertical-align:top;color:{colour}">{escape(text)}</span>'
    )


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
