"""A run whose every attempt is discarded trains nothing, and says so: it ends `failed` with the reason.

In a public Harbor task every attempt was `error` (the sandbox refused the task), yet the run printed
`status: completed` and exited 0: a user read a finished run that had learned nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_faults import ScriptedSampler, ScriptedTrainer, make_run

from loops_nb.run_events import RunEnded
from loops_nb.widgets import LiveRun


class Panel:
    """IPython's `display(obj, display_id=True)` for a LiveRun: keeps the last HTML it was given."""

    def __init__(self) -> None:
        self.last: Any = None

    def __call__(self, obj: Any, *, display_id: bool = True) -> Panel:
        self.last = obj
        return self

    def update(self, obj: Any) -> None:
        self.last = obj


class Ends:
    def __init__(self) -> None:
        self.ends: list[RunEnded] = []

    def on_end(self, ended: RunEnded) -> None:
        self.ends.append(ended)


async def test_every_attempt_discarded_ends_failed_with_the_reason(tmp_path: Path) -> None:
    sampler = ScriptedSampler(fail=set(range(1, 100)))
    panel, ends = Panel(), Ends()
    live = LiveRun(display_fn=panel)
    run = make_run(tmp_path, ScriptedTrainer(sampler), observers=[ends, live], max_steps=2, save_every=0)
    outcome = await run.execute(0)
    assert outcome.status == "failed" and outcome.steps == 2
    assert outcome.reason is not None
    assert outcome.reason.startswith(
        "no step trained: all 8 attempts were discarded (8 error); the first error: "
    )
    assert "sampler returned 503" in outcome.reason
    assert f"reason: {outcome.reason}" in outcome.describe()
    (end,) = ends.ends
    assert end.status == "failed" and end.reason == outcome.reason
    assert "failed: no step trained" in panel.last.to_html()
    assert "failed: no step trained" in (tmp_path / "run" / "run.log").read_text()


async def test_a_run_where_some_attempts_count_still_completes(tmp_path: Path) -> None:
    sampler = ScriptedSampler(fail={1, 2, 3})  # three of the first step's four attempts, not all
    run = make_run(tmp_path, ScriptedTrainer(sampler), max_steps=2, save_every=0)
    outcome = await run.execute(0)
    assert outcome.status == "completed" and outcome.reason is None
