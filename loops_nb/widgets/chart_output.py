"""`ChartOutput`: the live run's chart, an output of its own under the panel.

It holds a `RunChart` (plotly: reward or loss, and buttons for KL, entropy, tokens, timings and memory), shown live
as a plotly FigureWidget that each step sends only its new values to, so zoom and the chosen view survive, and
replaced by its static figure when the run ends. Where no such output can be shown (``display_fn`` frontends, no
plotly widget) ``live`` turns false and the panel draws the curve itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from loops_nb.run_events import RunStarted
from loops_nb.widgets.environment import DisplayFn, DisplayHandle
from loops_nb.widgets.reward_curve import LossCurve, RewardCurve
from loops_nb.widgets.run_chart import RunChart

if TYPE_CHECKING:
    from plotly.graph_objects import FigureWidget

log = logging.getLogger("loops_nb.widgets")


class ChartOutput:
    """``live``: whether the chart gets its own output (else the panel draws the curve); ``display_fn`` shows
    the live widget and returns its handle."""

    def __init__(self, *, live: bool, display_fn: DisplayFn) -> None:
        self.chart = RunChart()
        self.live = live
        self._display_fn = display_fn
        self.widget: FigureWidget | None = None
        self.handle: DisplayHandle | None = None

    @property
    def curve(self) -> RewardCurve | LossCurve | None:
        return self.chart.curve

    def on_start(self, started: RunStarted) -> None:
        if self.chart.curve is None:
            match started.recipe:
                case "rl" | "sft" as recipe:
                    self.chart = RunChart(recipe)

    def refresh(self, *, show_panel: Callable[[], object]) -> None:
        """Send the chart its new values. Its output appears once the recipe is known, so the live figure holds
        that recipe's views from the start, and after ``show_panel``, so it sits under the panel."""
        if self.handle is None and self.live and self.chart.curve is not None:
            show_panel()
            self.widget = self.chart.live_widget()
            if self.widget is not None:
                self.handle = self._display_fn(self.widget, display_id=True)
            else:
                self.live = False  # no plotly widget here: the panel draws the curve
        if self.widget is None:
            return
        try:
            self.chart.refresh(self.widget)
        except Exception:  # a chart glitch must never surface in the training loop
            log.exception("live chart update failed")

    def retire(self) -> None:
        """A FigureWidget saves nothing: the output becomes the static figure (plotly, HTML, text)."""
        if self.widget is None:
            return
        with contextlib.suppress(Exception):
            if self.handle is not None:
                self.handle.update(self.chart)
            # papermill (nbclient) saves every widget's last state in the notebook, closed or not, and a
            # FigureWidget's state carries plotly.js itself (5 MB); its output shows the static figure now.
            self.widget._esm = ""
            self.widget.close()
        self.widget = None
