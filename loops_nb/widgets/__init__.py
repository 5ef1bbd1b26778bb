"""Notebook widgets for runs and datasets: one object, three renderers (``text/plain``, sanitizer-proof
``text/html``, and plotly JSON for charts); live views go through one throttled `LiveDisplay` whose last update
is forced, so a saved notebook holds the final state. What each widget shows: docs/reference/notebook_widgets.md
(`RunComparison`, `SideBySide`: after_training.md).
"""

from loops_nb.widgets.attempts_table import AttemptsTable
from loops_nb.widgets.environment import LiveDisplay, environment, in_kernel, progress_mode
from loops_nb.widgets.live_run import LiveRun
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_compare import RunComparison, compare_runs
from loops_nb.widgets.run_health import Check, RunHealth
from loops_nb.widgets.side_by_side import SideBySide, side_by_side, side_by_side_sync
from loops_nb.widgets.target_preview import TargetPreview, TokenSequence, as_sequences
from loops_nb.widgets.token_counts import TokenCounts

__all__ = [
    "AttemptsTable",
    "Check",
    "LiveDisplay",
    "LiveRun",
    "RunChart",
    "RunComparison",
    "RunHealth",
    "SideBySide",
    "TargetPreview",
    "TokenCounts",
    "TokenSequence",
    "as_sequences",
    "compare_runs",
    "environment",
    "in_kernel",
    "progress_mode",
    "side_by_side",
    "side_by_side_sync",
]
