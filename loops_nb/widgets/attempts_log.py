"""`AttemptsLog`: a live run's attempts, one output per trained step, each displayed once and never re-rendered.

A live panel re-rendered twice a second replaces its whole HTML, so a transcript a person had opened (a
``<details>`` element) closed again within a second. So when a step has trained (``on_rollouts``, which says
which attempts trained), this log displays its attempts as a new output below the panel and never updates it
again; an older block is folded to one line. Attempts arrive (``on_attempt``) before anyone knows whether they
train and wait in a bounded buffer; a producer that never sends ``on_rollouts`` gets them shown at each
``flush``, which `LiveRun` then calls on every step.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import cast

from loops_nb.run_events import AttemptFinished, AttemptRow, StepRollouts
from loops_nb.widgets.attempts_table import AttemptsTable, merge_rollout
from loops_nb.widgets.environment import DisplayFn, DisplayHandle, TextLine
from loops_nb.widgets.style import GREY, div, fmt, plural

_PENDING_LIMIT = 4096  # attempts that never reach a step (async overshoot, stale re-queues) must not pile up


def step_caption(step: int | None, rows: list[AttemptRow]) -> str:
    """One step's attempts in a line: how many, their mean reward, how many trained and were discarded."""
    trained = sum(1 for r in rows if r.get("trained"))
    discarded = sum(1 for r in rows if r.get("discarded"))
    rewards = [
        reward for r in rows if isinstance(reward := r.get("reward"), int | float) and not r.get("discarded")
    ]
    mean = fmt(sum(rewards) / len(rewards), 3) if rewards else "-"
    where = f"step {step + 1}" if step is not None else "attempts"
    parts = [f"{where}: {plural(len(rows), 'attempt')}", f"mean reward {mean}"]
    if any("trained" in r for r in rows):
        parts.append(f"{trained:,} trained")
    parts.append(f"{discarded:,} discarded")
    return " · ".join(parts)


class AttemptsLog:
    """Attempts grouped by trained step, each step shown once through ``display_fn`` (see the module doc).

    ``keep_steps``: how many recent step blocks keep their rows; ``max_rows``: rows per block (the rest are in
    rollouts.jsonl); ``max_chars``: the longest prompt or completion shown."""

    def __init__(
        self,
        *,
        display_fn: DisplayFn | None,
        keep_steps: int = 5,
        max_rows: int = 32,
        max_chars: int = 2000,
    ) -> None:
        self.display_fn = display_fn
        self.keep_steps = keep_steps
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.pending: OrderedDict[str, AttemptRow] = OrderedDict()
        self.blocks: deque[tuple[AttemptsTable, DisplayHandle | None]] = deque()
        self.got_rollouts = False
        self.seen = 0
        self.trained = 0
        self.discarded = 0
        self.steps_shown = 0

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self.seen += 1
        if attempt.discarded:
            self.discarded += 1
        self.pending[attempt.attempt] = cast(AttemptRow, attempt.to_json())
        while len(self.pending) > _PENDING_LIMIT:
            self.pending.popitem(last=False)

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        """A step trained: its attempts, with what trained, shown as one block."""
        self.got_rollouts = True
        rows = []
        for rollout in rollouts.rows:
            row = self.pending.pop(str(rollout.get("attempt")), None)
            if row is None:  # on_attempt was not sent (or was dropped): the row alone, no transcript
                row = cast(AttemptRow, dict(rollout))
            merge_rollout(row, rollout)
            if rollout.get("trained"):
                self.trained += 1
            rows.append(row)
        self._show(rollouts.step, rows)

    def flush(self, step: int | None = None) -> None:
        """Show the buffered attempts as one block (for producers that send no ``on_rollouts``)."""
        if not self.pending:
            return
        rows = list(self.pending.values())
        self.pending.clear()
        for row in rows:
            row.setdefault("step", step)
        self._show(step, rows)

    def summary(self) -> str:
        if not self.seen and not self.steps_shown:
            return "attempts: none yet"
        parts = [plural(self.seen, "attempt")]
        if self.got_rollouts:
            parts.append(f"{self.trained:,} trained")
        parts.append(f"{self.discarded:,} discarded")
        if self.pending:
            parts.append(f"{len(self.pending):,} waiting for their step to train")
        return ", ".join(parts)

    def _show(self, step: int | None, rows: list[AttemptRow]) -> None:
        shown = rows[: self.max_rows]
        more = len(rows) - len(shown)
        tail = div(f"… {plural(more, 'more attempt')} of this step in rollouts.jsonl", f"color:{GREY}")
        caption = step_caption(step, rows)
        block = AttemptsTable.page(
            shown, caption, max_chars=self.max_chars, tail=tail if more > 0 else "", style=";margin-top:4px"
        )
        self.steps_shown += 1
        if self.display_fn is None:
            return
        handle = self.display_fn(block, display_id=True)
        self.blocks.append((block, handle))
        while len(self.blocks) > self.keep_steps:
            old, old_handle = self.blocks.popleft()
            if old_handle is not None:  # one line, so a long run's notebook stays small
                where = "(transcripts in the run's transcripts/ folder and rollouts.jsonl)"
                old_handle.update(TextLine(f"{old.summary()} {where}"))
