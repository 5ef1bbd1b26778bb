"""`RunChart`: a run's metrics per step in one interactive plotly chart, with a selector for what to show.

The first view is the recipe's curve (RL: mean reward with its ±std band and the eval reward; SFT: train loss and
the held-out loss, before training too); buttons above the plot switch to KL, entropy, tokens, timings, memory
(the process tree's RSS and the peak) and, for SFT, the gradient norm and learning rate. The buttons are plotly's
own (``updatemenus``), so they work in a live notebook, a papermill-saved one reopened untrusted, and the HTML
plotly exports, without a kernel.

Live: `LiveRun` shows `live_widget()` (a plotly ``FigureWidget``) under its panel and calls `refresh` after
each step, which sends only the new x/y values: a person's zoom, pan and chosen view survive the updates. A
FigureWidget needs a kernel with a frontend, and saves nothing, so when the run ends its output is replaced by the
static bundle (`_repr_mimebundle_`: the plotly figure, the sanitizer-proof HTML chart for nbconvert and GitHub,
a text summary). After the run: ``RunChart.from_run("runs/<name>")`` draws the same chart from its files.

Steps are numbered from 1, as in the panel; an eval at 0 is the model before training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loops_nb.run_events import EvalRecord
from loops_nb.runs_table import read_run
from loops_nb.step_record import StepRecord
from loops_nb.widgets.reward_curve import LossCurve, RewardCurve
from loops_nb.widgets.svg_chart import Series, fmt

if TYPE_CHECKING:
    from plotly.graph_objects import FigureWidget

Recipe = Literal["rl", "sft"]


@dataclass(frozen=True)
class Metric:
    key: str
    """The steps.jsonl key."""
    name: str
    """The legend's name."""
    color: str


@dataclass(frozen=True)
class View:
    """One button of the selector: the metrics it plots on one y axis."""

    label: str
    y_label: str
    metrics: tuple[Metric, ...]
    recipes: tuple[Recipe, ...] = ("rl", "sft")


VIEWS = (
    View(
        "KL",
        "KL, sampler vs trainer",
        (
            Metric("kl/sample_train_v1", "kl v1 (mean Δlogprob)", "#0891b2"),
            Metric("kl/sample_train_v2", "kl v2 (mean Δ²/2)", "#7c3aed"),
        ),
        ("rl",),
    ),
    View("entropy", "nats per sampled token", (Metric("entropy", "entropy", "#ea580c"),), ("rl",)),
    View("grad norm", "gradient norm", (Metric("optim/grad_norm", "grad norm", "#0891b2"),), ("sft",)),
    View("learning rate", "learning rate", (Metric("learning_rate", "learning rate", "#65a30d"),), ("sft",)),
    View(
        "tokens",
        "tokens per step",
        (
            Metric("tokens/sampled", "sampled", "#2563eb"),
            Metric("tokens/total", "in the batch", "#2563eb"),
            Metric("tokens/trained", "trained", "#16a34a"),
        ),
    ),
    View(
        "timings",
        "seconds per step",
        (
            Metric("time/step_s", "step", "#111827"),
            Metric("time/rollout_s", "rollouts", "#2563eb"),
            Metric("time/train_s", "train", "#16a34a"),
            Metric("time/publish_s", "publish", "#ea580c"),
            Metric("time/eval_s", "eval", "#7c3aed"),
        ),
    ),
    View(
        "memory",
        "GB resident",
        (
            Metric("memory/rss_gb", "RSS (process tree)", "#dc2626"),
            Metric("memory/peak_gb", "peak (this process)", "#9ca3af"),
        ),
    ),
)
_UIREVISION = "loops_nb-run-chart"  # constant: plotly keeps zoom and the chosen view across updates


class RunChart:
    """The per-step chart of one run; a run observer (``on_step``, ``on_eval``) or read with `from_run`.

    ``recipe`` picks the first view (``"rl"``: reward, ``"sft"``: loss); without it the first record decides.
    """

    def __init__(self, recipe: Recipe | None = None) -> None:
        self.recipe: Recipe | None = recipe
        self.curve: RewardCurve | LossCurve | None = None
        if recipe is not None:
            self.curve = RewardCurve() if recipe == "rl" else LossCurve()
        self.records: list[StepRecord] = []

    @classmethod
    def from_run(cls, run_dir: str | Path) -> RunChart:
        """The chart of a run directory (``runs/<name>``), from steps.jsonl and evals.jsonl."""
        run = read_run(run_dir)
        chart = cls("sft" if run.recipe == "sft" else "rl" if run.recipe == "rl" else None)
        evals = Path(run_dir) / "evals.jsonl"
        if evals.is_file():
            for line in evals.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line torn by a crash mid-write
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    chart.on_eval(EvalRecord.from_json(record))
        for record in run.records:
            chart.on_step(record)
        return chart

    # -- observer ---------------------------------------------------------------------------------------------

    def on_step(self, step: StepRecord) -> None:
        if self.curve is None:
            self.recipe = "rl" if "reward/mean" in step.metrics else "sft"
            self.curve = RewardCurve() if self.recipe == "rl" else LossCurve()
        # A resumed run re-logs the steps after its checkpoint: the later ones go.
        self.records = [r for r in self.records if r.step < step.step] + [step]
        self.curve.on_step(step)

    def on_eval(self, line: EvalRecord) -> None:
        if self.curve is None:
            self.recipe = "sft" if "eval/loss" in line.metrics else "rl"
            self.curve = LossCurve() if self.recipe == "sft" else RewardCurve()
        self.curve.on_eval(line)

    # -- the figure -------------------------------------------------------------------------------------------

    def views(self, *, every: bool = False) -> list[tuple[View, list[Series]]]:
        """The selector's views with their series: those with data, or (``every``) all of the recipe's, so a
        live figure has the same traces from its first step to its last."""
        out: list[tuple[View, list[Series]]] = []
        if self.curve is not None:
            curve_view = View(self.curve.title, self.curve.y_label, ())
            out.append((curve_view, self._curve_series(every)))
        for view in VIEWS:
            if self.recipe is not None and self.recipe not in view.recipes:
                continue
            series = [self._series(m) for m in view.metrics]
            if not every:
                series = [s for s in series if s.points()]
            if series:
                out.append((view, series))
        return out

    def to_plotly(self, *, every: bool = False) -> dict[str, Any]:
        """A JSON-ready plotly figure: one button per view, the first shown."""
        import plotly.graph_objects as go

        from loops_nb.widgets.plotly_chart import plotly_figure

        views = self.views(every=every)
        data: list[dict[str, Any]] = []
        owner: list[int] = []  # the view each trace belongs to
        for index, (_view, series) in enumerate(views):
            traces = plotly_figure(series)["data"]
            data += traces
            owner += [index] * len(traces)
        for trace, index in zip(data, owner, strict=True):
            trace["visible"] = index == 0
        buttons = [
            {
                "label": view.label,
                "method": "update",
                "args": [{"visible": [o == index for o in owner]}, {"yaxis.title.text": view.y_label}],
            }
            for index, (view, _) in enumerate(views)
        ]
        fig = go.Figure(data=data)
        fig.update_layout(
            template="plotly_white",
            height=340,
            uirevision=_UIREVISION,
            margin={"l": 60, "r": 20, "t": 60, "b": 45},
            xaxis={"title": {"text": "step"}, "rangemode": "tozero", "dtick": self._dtick()},
            yaxis={"title": {"text": views[0][0].y_label if views else ""}},
            legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
            hovermode="closest",
            updatemenus=[
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
            if len(buttons) > 1
            else [],
        )
        return json.loads(json.dumps(fig.to_dict()))

    # -- live -------------------------------------------------------------------------------------------------

    def live_widget(self) -> FigureWidget | None:
        """A plotly FigureWidget of every view of the recipe (refresh it with `refresh`); None when plotly's
        widget cannot be built here."""
        try:
            import plotly.graph_objects as go

            return go.FigureWidget(self.to_plotly(every=True))
        except Exception:  # no anywidget, an old plotly: the panel goes on without a live chart
            return None

    def refresh(self, widget: FigureWidget) -> None:
        """Send the new values to ``widget`` (from `live_widget`): x, y and hover text only, so its zoom and
        chosen view stay."""
        fresh = {t.get("name"): t for t in self.to_plotly(every=True)["data"]}
        with widget.batch_update():
            widget.layout.xaxis.dtick = self._dtick()
            for trace in widget.data:
                new = fresh.get(trace.name)
                if new is not None:
                    trace.x, trace.y, trace.text = new.get("x"), new.get("y"), new.get("text")

    # -- static renderers -------------------------------------------------------------------------------------

    def summary(self) -> str:
        parts = [self.curve.summary()] if self.curve is not None else ["no steps yet"]
        last = self.records[-1] if self.records else None
        if last is not None:
            if (rss := last.number("memory/rss_gb")) is not None:
                parts.append(f"memory {fmt(rss, 3)} GB")
            if (seconds := last.number("time/step_s")) is not None:
                parts.append(f"last step {fmt(seconds, 3)} s")
        return " · ".join(parts)

    def __repr__(self) -> str:
        return f"<RunChart: {self.summary()}>"

    def to_html(self) -> str:
        """The sanitizer-proof chart (positioned divs) and the summary: what nbconvert and GitHub show."""
        chart = self.curve.to_dot_chart(width=520) if self.curve is not None else ""
        return (
            f'<div style="display:inline-block">{chart}'
            f'<div style="font:11px monospace;color:#374151;margin-top:2px">{escape(self.summary())}</div></div>'
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        from loops_nb.widgets.plotly_chart import plotly_bundle

        bundle: dict[str, Any] = {"text/plain": self.summary(), "text/html": self.to_html()}
        if any(s.points() for _, series in self.views() for s in series):
            bundle.update(plotly_bundle(self.to_plotly()))
        return bundle

    # -- internals --------------------------------------------------------------------------------------------

    def _dtick(self) -> int | None:
        """Whole steps on the x axis while they are few (plotly would mark 0.5 steps); plotly's choice after."""
        last = self.records[-1].step + 1 if self.records else 0
        return 1 if last <= 12 else None

    def _series(self, metric: Metric) -> Series:
        xs, ys = [], []
        for record in self.records:
            if metric.key in record.metrics:
                xs.append(record.step + 1)
                ys.append(record.number(metric.key))
        return Series(
            metric.name,
            xs,
            ys,
            metric.color,
            hover=[f"step {x}: {metric.name} {fmt(y)}" for x, y in zip(xs, ys, strict=True)],
        )

    def _curve_series(self, every: bool) -> list[Series]:
        """The curve's series; with ``every`` its band and eval too, empty until they have values."""
        assert self.curve is not None
        series = self.curve.series()
        if not every:
            return series
        names = {s.name for s in series}
        main = series[0]
        if isinstance(self.curve, RewardCurve) and main.band is None:
            series[0] = Series(
                main.name,
                main.xs,
                main.ys,
                main.color,
                band=([None] * len(main.xs), [None] * len(main.xs)),
                hover=main.hover,
            )
        eval_name = "eval reward" if isinstance(self.curve, RewardCurve) else "eval loss"
        if eval_name not in names:
            series.append(Series(eval_name, [], [], "#7c3aed", dash=True, connect_gaps=True, hover=[]))
        return series
