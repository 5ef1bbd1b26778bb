"""RL attempts with their transcripts one click away: `AttemptsTable`, live or a page of a finished run.

Reading transcripts is the check that numbers cannot replace: a reward that rises because the model found a
loophole looks like learning on every chart. The table keeps the last ``max_rows`` attempts (bounded: a run
makes thousands), each rendered by `attempt_rows` with its transcript folded under it.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any, cast

from loops_nb.errors import UserError
from loops_nb.run_dir import JsonlLog
from loops_nb.run_events import AttemptFinished, StepRollouts
from loops_nb.widgets.attempt_rows import AttemptRow, attempts_html, merge_rollout, text_table
from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import fmt, plural

SORTS = {"step": "step", "reward": "reward", "tokens": "sampled_tokens", "time": "seconds"}
STATUSES = ("trained", "not_trained", "discarded", "kept")


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
        return attempts_html(self.summary(), note, self._ordered(), self.max_chars, anchor=anchor)

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
