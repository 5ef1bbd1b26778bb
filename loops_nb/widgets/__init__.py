"""Notebook widgets for runs and datasets: one object, three renderers.

Every object here renders as a one-line ``text/plain``, an inline-styled ``text/html`` snapshot (no ``<style>``,
``<script>``, ``data-*`` or CSS JupyterLab's sanitizer drops, so it survives untrusted notebooks and offline
HTML export) and, for charts, plotly
JSON. Live views go through one throttled display handle (`LiveDisplay`) whose last update is forced, so a
notebook saved by papermill or nbconvert holds the final state. In scripts the same objects print text.

- `LiveRun`: a run observer showing progress, ETA, the curve, health hints and tokens, each trained step's
  attempts below it (displayed once, so an opened transcript stays open), an optional Stop button, and how to
  resume a run that stopped early.
- `RunChart`: a run's training curve (reward or loss, with the evaluations) and every other per-step metric in
  one plotly chart with a view selector; live under `LiveRun`, or on its own (`chart.show()`), or read back
  from a run directory (`RunChart.from_run`). The series are defined once, in `series`.
- `TokenCounts`: sampled/trained tokens per step, or a dataset's trained/untrained totals.
- `TargetPreview`: tokens coloured by loss weight (SFT examples, RL captures).
- `AttemptsTable`: recent RL attempts with their transcripts; `AttemptsTable.from_run` pages through all of a
  run's attempts, sorted and filtered.
- `RunHealth`: the numbers to read first, with hints.
- `RunComparison` (`compare_runs`): several runs' curves overlaid and the runs table.
- `SideBySide` (`side_by_side`): several models' replies to the same prompts, logprobs on hover.
"""

from loops_nb.widgets.attempts_table import AttemptsTable
from loops_nb.widgets.environment import LiveDisplay, environment, in_kernel, progress_mode
from loops_nb.widgets.live_run import LiveRun
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_compare import RunComparison, compare_runs
from loops_nb.widgets.run_health import Check, RunHealth
from loops_nb.widgets.side_by_side import SideBySide, side_by_side, side_by_side_sync
from loops_nb.widgets.target_preview import TargetPreview
from loops_nb.widgets.token_counts import TokenCounts
from loops_nb.widgets.token_sequence import TokenSequence, as_sequences

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
