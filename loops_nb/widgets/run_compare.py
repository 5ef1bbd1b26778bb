"""Several runs side by side: their curves overlaid (each run's `RunChart` series), and the runs table. How to
use it, the legend and the renderers: docs/reference/after_training.md, "Compare runs".
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from html import escape
from typing import Any, Unpack

from loops_nb.runs_table import Runs, is_eval_measure, read_runs
from loops_nb.widgets.environment import DisplayOptions, LiveDisplay, Widget
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.series import CURVE_KEYS, Series, metric_definition, series_table, traces
from loops_nb.widgets.style import FONT, div, fmt, heading, sparkline, tag

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#4b5563")
_STATUS_COLOR = {"failed": "#b91c1c", "running": "#2563eb"}


def default_metrics(runs: Runs) -> list[str]:
    """``reward/mean`` and ``loss`` where any run logged them, then every ``eval/*`` measure."""
    keys = dict.fromkeys(key for run in runs for key in run.metric_keys())
    return [k for k in CURVE_KEYS if k in keys] + [k for k in keys if is_eval_measure(k)]


class RunComparison(Widget):
    """The runs ``patterns`` name, their curves overlaid per metric."""

    def __init__(
        self,
        patterns: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        metrics: Sequence[str] | None = None,
    ) -> None:
        self.patterns = [patterns] if isinstance(patterns, str | os.PathLike) else list(patterns)
        self.requested = list(metrics) if metrics is not None else None
        self._display: LiveDisplay | None = None
        self.refresh()

    def refresh(self) -> RunComparison:
        """Re-read the run directories (new steps, new runs the globs now match) and update the display."""
        self.runs = read_runs(self.patterns)
        self.charts = [RunChart.from_run(run) for run in self.runs]
        self.colors = [PALETTE[i % len(PALETTE)] for i in range(len(self.runs))]
        if self._display is not None:
            self._display.update(force=True)
        return self

    @property
    def metrics(self) -> list[str]:
        return self.requested if self.requested is not None else default_metrics(self.runs)

    def labels(self) -> list[str]:
        return self.runs.labels()

    def series(self, key: str) -> list[Series]:
        """One line per run that logged ``key``: the points its `RunChart` has (numbered as there, from 1)."""
        out = []
        for run, chart, label, color in zip(self.runs, self.charts, self.labels(), self.colors, strict=True):
            s = chart.series(metric_definition(key, chart.kind))
            if s.has_points():
                hover = [f"{run.name} · {h}" for h in s.hover]
                out.append(replace(s, name=label, color=color, hover=hover, band=None, evaluation=False))
        return out

    # -- text ---------------------------------------------------------------------------------------------

    def summary(self) -> str:
        return f"RunComparison({len(self.runs)} runs; {', '.join(self.metrics) or 'no metrics'})"

    __repr__ = summary

    def plain_text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        lines = [self.summary(), *self.runs.describe()]
        labels = self.labels()
        width = max((len(label) for label in labels), default=0)
        for metric in self.metrics:
            lines.append(f"{metric}:")
            for s in self.series(metric):
                last = next((y for y in reversed(s.ys) if y is not None), None)
                lines.append(f"  {s.name.ljust(width)}  last {fmt(last, 4):>8}  {sparkline(s.ys)}")
        return "\n".join(lines)

    # -- html ---------------------------------------------------------------------------------------------

    def to_html(self) -> str:
        out = [heading(self.summary()), self._table_html()]
        for metric in self.metrics:
            series = self.series(metric)
            if any(s.has_points() for s in series):
                out.append(div(series_table(series, title=metric), "margin-top:6px"))
        return div("".join(out), f"{FONT};color:#1f2328")

    def table(self) -> dict[str, list[str]]:
        """The runs table, column by column (`Runs.columns`): what both the HTML and the plotly table show;
        ``differs`` is each run's legend label."""
        return {**self.runs.columns(), "differs": self.labels()}

    def _table_html(self) -> str:
        cell = "padding:2px 8px;border-bottom:1px solid #e5e7eb;text-align:left;white-space:nowrap"
        table = self.table()
        head = "".join(tag("th", escape(c), f"{cell};color:#374151") for c in table)
        rows = []
        for i, (run, color) in enumerate(zip(self.runs, self.colors, strict=True)):
            tds = []
            for column, values in table.items():
                text = values[i]
                c = {"name": color, "differs": color, "status": _STATUS_COLOR.get(text)}.get(column)
                title = str(run.path) if column == "name" else text
                bold = f";color:{c};font-weight:600" if c else ""
                tds.append(tag("td", escape(text), f"{cell}{bold}", title))
            rows.append(tag("tr", "".join(tds)))
        return tag("table", tag("tr", head) + "".join(rows), "border-collapse:collapse;font-size:12px")

    # -- plotly -------------------------------------------------------------------------------------------

    def to_plotly(self) -> dict[str, Any]:
        """The runs table on top (a plotly table: live JupyterLab shows only this figure of the bundle), then one
        panel per metric, stacked, sharing one legend entry per run."""
        metrics = [m for m in self.metrics if any(s.has_points() for s in self.series(m))]
        panel, gap = 240, 60
        table_height = 60 + 40 * len(self.runs)  # a wrapped cell makes its row taller than "height"
        height = 40 + table_height + (panel + gap) * len(metrics)
        data: list[dict[str, Any]] = [self._plotly_table(1 - table_height / height)]
        layout: dict[str, Any] = {
            "template": "plotly_white",
            "height": height,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
            "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
            "title": {"text": f"{len(self.runs)} runs"},
        }
        shown: set[str] = set()
        top = height - table_height - gap
        for i, metric in enumerate(metrics, 1):
            suffix = "" if i == 1 else str(i)
            for s in self.series(metric):
                for trace in traces(s, marker_size=5):
                    trace |= {"showlegend": s.name not in shown, "connectgaps": True}
                    data.append(trace | {"xaxis": f"x{suffix}", "yaxis": f"y{suffix}"})
                shown.add(s.name)
            domain = [max(0.0, (top - panel) / height), top / height]
            layout[f"yaxis{suffix}"] = {"title": {"text": metric}, "domain": domain, "anchor": f"x{suffix}"}
            layout[f"xaxis{suffix}"] = {"title": {"text": "step"}, "anchor": f"y{suffix}"}
            top -= panel + gap
        return {"data": data, "layout": layout}

    def _plotly_table(self, bottom: float) -> dict[str, Any]:
        table = self.table()
        colors = [self.colors if c in ("name", "differs") else ["#1f2328"] * len(self.runs) for c in table]
        return {
            "type": "table",
            "domain": {"x": [0, 1], "y": [bottom, 1]},
            "columnwidth": [3, 1, 3, 1, 1.4, 1.2, 2.6, 1, 3],
            "header": {
                "values": list(table),
                "align": "left",
                "fill": {"color": "#f3f4f6"},
                "font": {"size": 12},
            },
            "cells": {
                "values": list(table.values()),
                "align": "left",
                "font": {"size": 12, "color": colors},
                "height": 24,
            },
        }

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, object]:
        bundle = super()._repr_mimebundle_()
        figure = self.to_plotly()
        if len(figure["data"]) > 1:  # a table and at least one curve
            bundle["application/vnd.plotly.v1+json"] = figure
        return bundle

    def show(self, **options: Unpack[DisplayOptions]) -> LiveDisplay:
        """Display the comparison and return its `LiveDisplay` (``refresh()`` updates it)."""
        self._display = LiveDisplay(self, **options).show()
        return self._display

    async def watch(
        self, *, every: float = 5.0, until_done: bool = True, timeout: float | None = None
    ) -> None:
        """Show the comparison and re-read the runs every ``every`` seconds while any is ``running`` (or until
        ``timeout``); awaitable in a running notebook loop, so a run can train in another cell or process."""
        if self._display is None:
            self.show()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            self.refresh()
            running = any(r.status == "running" for r in self.runs)
            if (until_done and not running) or (deadline is not None and loop.time() >= deadline):
                break
            await asyncio.sleep(every)
        assert self._display is not None
        self._display.finalize()


def compare_runs(*patterns: str | os.PathLike[str], metrics: Sequence[str] | None = None) -> RunComparison:
    """The runs named by ``patterns`` (run directories, globs such as ``runs/*``, or folders of runs) compared."""
    return RunComparison(list(patterns) or ["runs/*"], metrics=metrics)
