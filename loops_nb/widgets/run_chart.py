"""`RunChart`: a run's metrics per step in one plotly chart, live in the notebook and saved with it.

Plotly's own buttons (``updatemenus``) switch views, so they work live, reopened untrusted and in plotly's HTML
export alike. The series: `loops_nb.widgets.series`; what it shows, live (`LiveChart`) and saved, and how steps
are numbered: docs/reference/notebook_widgets.md.
"""

from __future__ import annotations

import logging
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

from loops_nb.run_dir import JsonlLog
from loops_nb.run_events import EvalRecord, RunStarted, StepRecord
from loops_nb.runs_table import RunSummary, read_run
from loops_nb.widgets.environment import DisplayOptions, LiveDisplay, Widget, ipython_display
from loops_nb.widgets.series import (
    CURVES,
    VIEWS,
    CurveKind,
    Metric,
    Series,
    View,
    curve_kind,
    series_table,
    traces,
)
from loops_nb.widgets.style import fmt, plural, sparkline

if TYPE_CHECKING:
    from loops_nb.widgets.live_figure import LiveFigure

log = logging.getLogger("loops_nb.widgets")
_UIREVISION = "loops_nb-run-chart"  # constant: plotly keeps zoom and the chosen view across updates
_BEST = {"reward": max, "loss": min}


class RunChart(Widget):
    """The per-step chart of one run: a run observer (``on_start``, ``on_step``, ``on_eval``) or `from_run`.

    ``recipe`` (``"rl"`` or ``"sft"``) picks the curve; without it the run's first event decides. ``spread`` is
    the reward's band: ±std, or the ``reward/min``..``reward/max`` range.
    """

    def __init__(self, recipe: str | None = None, *, spread: Literal["std", "minmax"] = "std") -> None:
        self.kind: CurveKind | None = curve_kind(recipe)
        self.spread = spread
        self.records: list[StepRecord] = []
        self.evals: dict[int, EvalRecord] = {}
        """Each evaluation, by the steps applied before it (0: the base model)."""

    @classmethod
    def from_run(cls, run: str | Path | RunSummary) -> RunChart:
        """The chart of a run directory (``runs/<name>``, or one `read_run` read), from steps.jsonl and
        evals.jsonl."""
        if not isinstance(run, RunSummary):
            run = read_run(run)
        chart = cls(run.recipe)
        for line in JsonlLog(run.path / "evals.jsonl").records():  # a torn last line is skipped
            if isinstance(line.get("step"), int):
                chart.on_eval(EvalRecord.from_json(line))
        for record in run.records:
            chart.on_step(record)
        return chart

    # -- observer ---------------------------------------------------------------------------------------------

    def on_start(self, started: RunStarted) -> None:
        self.kind = self.kind or curve_kind(started.recipe)

    def on_step(self, step: StepRecord) -> None:
        self.kind = self.kind or curve_kind(keys=step.metrics)
        # A resumed run re-logs the steps after its checkpoint: the later ones go.
        self.records = [r for r in self.records if r.step < step.step] + [step]

    def on_eval(self, evaluation: EvalRecord) -> None:
        self.kind = self.kind or curve_kind(keys=evaluation.metrics)
        self.evals[evaluation.step] = evaluation

    # -- series -----------------------------------------------------------------------------------------------

    def points(self, metric: Metric) -> dict[int, float | None]:
        """``metric``'s value by step (numbered from 1; an evaluation at the steps applied before it)."""
        out: dict[int, float | None] = {}
        for record in self.records:
            if metric.key in record.metrics:
                out[record.step + (0 if metric.before_step else 1)] = record.number(metric.key)
        if metric.evaluation:  # the same evaluation may come as an event and in a step record: one point
            out |= {step: e.number(metric.key) for step, e in self.evals.items() if metric.key in e.metrics}
        return dict(sorted(out.items()))

    def series(self, metric: Metric, *, band: bool = False) -> Series:
        """``metric`` as a `Series`; ``band`` gives a spread metric its band even before it has values."""
        points = self.points(metric)
        xs, ys = list(points), list(points.values())
        hover = [_hover(metric, x, y) for x, y in points.items()]
        spread = None
        if metric.spread:
            prefix = metric.key.rsplit("/", 1)[0]

            def at(name: str) -> list[float | None]:  # the spread's values at the curve's steps
                return [self.points(Metric(f"{prefix}/{name}", "", "")).get(x) for x in xs]

            if self.spread == "std":
                std = at("std")
                lows = [None if y is None or s is None else y - s for y, s in zip(ys, std, strict=True)]
                highs = [None if y is None or s is None else y + s for y, s in zip(ys, std, strict=True)]
                hover = [h if s is None else f"{h} ± {fmt(s, 3)}" for h, s in zip(hover, std, strict=True)]
            else:
                lows, highs = at("min"), at("max")
                hover = [
                    h if a is None or b is None else f"{h} [{fmt(a, 3)}, {fmt(b, 3)}]"
                    for h, a, b in zip(hover, lows, highs, strict=True)
                ]
            if band or any(v is not None for v in lows):
                spread = (lows, highs)
        return Series(metric.name, metric.color, xs, ys, hover, spread, metric.evaluation)

    def views(self, *, every: bool = False) -> list[tuple[View, list[Series]]]:
        """The chart's views with their series: those with points, or (``every``) all of the curve kind's, so a
        live figure has the same traces from its first step to its last."""
        candidates = [CURVES[self.kind], *VIEWS] if self.kind is not None else list(VIEWS)
        out: list[tuple[View, list[Series]]] = []
        for view in candidates:
            if self.kind is not None and self.kind not in view.kinds:
                continue
            series = [self.series(m, band=every) for m in view.metrics]
            if not every:
                series = [s for s in series if s.has_points()]
            if series:
                out.append((view, series))
        return out

    # -- renderers --------------------------------------------------------------------------------------------

    def to_plotly(self, *, every: bool = False) -> dict[str, Any]:
        """A JSON-ready plotly figure: one button per view, the first shown."""
        views = self.views(every=every)
        data: list[dict[str, Any]] = []
        owner: list[int] = []  # the view each trace belongs to
        for index, (_view, series) in enumerate(views):
            for s in series:
                for trace in traces(s):
                    data.append({**trace, "visible": index == 0})
                    owner.append(index)
        buttons = [
            {
                "label": view.label,
                "method": "update",
                "args": [{"visible": [o == index for o in owner]}, {"yaxis.title.text": view.y_label}],
            }
            for index, (view, _) in enumerate(views)
        ]
        last = self.records[-1].step + 1 if self.records else 0
        layout: dict[str, Any] = {
            "template": "plotly_white",
            "height": 340,
            "uirevision": _UIREVISION,
            "margin": {"l": 60, "r": 20, "t": 60, "b": 45},
            # Whole steps while they are few (plotly would mark half steps); plotly's choice after.
            "xaxis": {"title": {"text": "step"}, "rangemode": "tozero", "dtick": 1 if last <= 12 else None},
            "yaxis": {"title": {"text": views[0][0].y_label if views else ""}},
            "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
            "hovermode": "closest",
        }
        if len(buttons) > 1:
            layout["updatemenus"] = [
                {
                    "type": "buttons",
                    "direction": "right",
                    "showactive": True,
                    "active": 0,
                    "x": 0,
                    "xanchor": "left",
                    "y": 1.1,
                    "yanchor": "bottom",
                    "pad": {"r": 4, "t": 0},
                    "buttons": buttons,
                }
            ]
        return {"data": data, "layout": layout}

    def curve(self) -> list[Series]:
        """The training curve's series that have points (none while the curve kind is unknown)."""
        if self.kind is None:
            return []
        return [s for m in CURVES[self.kind].metrics if (s := self.series(m)).has_points()]

    def summary(self) -> str:
        """One line: the curve's numbers (last, best, evaluations), the memory and the last step's time."""
        if self.kind is None:
            return "no steps yet"
        main, evaluation = (self.points(m) for m in CURVES[self.kind].metrics)
        values = [v for v in main.values() if v is not None]
        last = values[-1] if values else None
        text = f"{self.kind}: {plural(len(values), 'step')}, last {fmt(last, 3)}"
        if self.kind == "reward":
            text += f", best {fmt(max(values) if values else None, 3)}"
        if evaluation.get(0) is not None:
            text += f", eval before training {fmt(evaluation[0], 3)}"
        later = [(x, v) for x, v in evaluation.items() if x > 0 and v is not None]
        if later:
            best = _BEST[self.kind](v for _, v in later)
            text += f", eval {fmt(later[-1][1], 3)} at step {later[-1][0]}, best eval {fmt(best, 3)}"
        parts = [text]
        record = self.records[-1] if self.records else None
        if record is not None and (rss := record.number("memory/rss_gb")) is not None:
            parts.append(f"memory {fmt(rss, 3)} GB")
        if record is not None and (seconds := record.number("time/step_s")) is not None:
            parts.append(f"last step {fmt(seconds, 3)} s")
        return " · ".join(parts)

    def __str__(self) -> str:
        main = self.points(CURVES[self.kind].metrics[0]) if self.kind is not None else {}
        return f"{self.summary()} {sparkline(list(main.values()))}".rstrip()

    def to_html(self) -> str:
        """The curve's points as a table and the summary: what a frontend without JavaScript shows."""
        return (
            f'<div style="display:inline-block">{series_table(self.curve())}'
            f'<div style="font:11px monospace;color:#374151;margin-top:2px">{escape(self.summary())}</div></div>'
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, object]:
        bundle = super()._repr_mimebundle_()
        if any(s.has_points() for _, series in self.views() for s in series):
            bundle["application/vnd.plotly.v1+json"] = self.to_plotly()
        return bundle

    def show(self, *, live: bool | None = None, **options: Unpack[DisplayOptions]) -> LiveChart:
        """Display the chart and return its `LiveChart`: call ``.update()`` after feeding it, ``.finalize()`` at
        the end. ``live``: a `LiveFigure` (default: in a kernel, not with a ``display_fn``, whose frontend may
        have no widgets) or the static figure re-rendered at most ``max_hz`` times a second."""
        return LiveChart(self, live=live, **options).show()


class LiveChart(LiveDisplay):
    """A `RunChart` on screen: a `LiveFigure` fed each update's values, or, where no widget can be shown, the
    static figure re-rendered in place (``options``: a `LiveDisplay`'s). ``finalize`` leaves the static figure,
    which a saved notebook keeps."""

    def __init__(
        self, chart: RunChart, *, live: bool | None = None, **options: Unpack[DisplayOptions]
    ) -> None:
        super().__init__(chart, **options)
        self.chart = chart
        self.live = self.output == "display" and (options.get("display_fn") is None if live is None else live)
        self.figure: LiveFigure | None = None  # while it is shown

    def show(self) -> LiveChart:
        """Display the chart (once; later calls do nothing)."""
        if self.shown:
            return self
        if self.live:
            try:
                from loops_nb.widgets.live_figure import LiveFigure

                self.figure = LiveFigure(self.chart.to_plotly(every=True))
            except Exception:  # no anywidget, no plotly.js: the static figure instead
                log.info("no live chart here; showing the static figure", exc_info=True)
                self.live = False
            else:
                self.shown = True
                self.handle = (self._display_fn or ipython_display)(self.figure, display_id=True)
                return self
        super().show()
        return self

    def update(self, *, force: bool = False) -> bool:
        """Send the chart's new values to the screen."""
        try:
            if self.figure is None:
                return super().update(force=force)
            self.figure.figure = self.chart.to_plotly(every=True)
            return True
        except Exception:  # a chart glitch must never surface in the training loop
            log.exception("live chart update failed")
            return False

    def finalize(self) -> None:
        """The output becomes the static figure (plotly, the table, text); the widget is closed. Again: nothing
        (a notebook calls ``live.finalize()`` after the run's own ``on_end`` did)."""
        if self.figure is None:
            if not (self.live and self.shown):  # a retired widget's output is final
                self.live = False
                super().finalize()
            return
        try:
            if self.handle is not None:
                self.handle.update(self.chart)
        finally:
            self.figure.retire()
            self.figure = None


def _hover(metric: Metric, x: int, y: float | None) -> str:
    if not metric.evaluation:
        return f"step {x}: {metric.name} {fmt(y)}"
    what = metric.name.removeprefix("eval ")
    return f"eval {'before training' if x == 0 else f'after {x} steps'}: {what} {fmt(y)}"
