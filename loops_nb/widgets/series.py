"""Every series the widgets plot, defined once: its steps.jsonl key, its name, its colour, the view it sits in,
and which training curve it belongs to; and the two ways a series is drawn (plotly traces, and a table where a
saved notebook runs no JavaScript).

`RunChart` (live and saved) and `compare_runs` read these definitions (`metric_definition`); `curve_kind` is the
one place that decides whether a run's curve is the reward (RL) or the loss (SFT).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Literal

from loops_nb.widgets.style import FONT, GREY, div, fmt, tag

CurveKind = Literal["reward", "loss"]
EVAL_COLOR = "#7c3aed"


@dataclass(frozen=True)
class Metric:
    key: str
    """The steps.jsonl (or evals.jsonl) key."""
    name: str
    """The legend's name, and the hover's."""
    color: str
    spread: bool = False
    """Drawn with a band: ±``<prefix>/std``, or ``<prefix>/min``..``<prefix>/max`` (``reward/std``, ...)."""
    evaluation: bool = False
    """An evaluation (dashed, its gaps bridged): at the steps applied before it, 0 being before training."""
    before_step: bool = False
    """In a step record, it measured the policy the step started from (RL's eval of the policy it sampled)."""


@dataclass(frozen=True)
class View:
    """One button of a run's chart: the metrics it plots on one y axis."""

    label: str
    y_label: str
    metrics: tuple[Metric, ...]
    kinds: tuple[CurveKind, ...] = ("reward", "loss")


CURVES: dict[CurveKind, View] = {
    "reward": View(
        "reward",
        "reward/mean",
        (
            Metric("reward/mean", "reward/mean", "#2563eb", spread=True),
            Metric("eval/reward_mean", "eval reward", EVAL_COLOR, evaluation=True, before_step=True),
        ),
        ("reward",),
    ),
    "loss": View(
        "loss",
        "loss",
        (
            Metric("loss", "train loss", "#dc2626"),
            Metric("eval/loss", "eval loss", EVAL_COLOR, evaluation=True),
        ),
        ("loss",),
    ),
}
"""The training curve of each kind: what a run's chart opens on."""

VIEWS = (
    View(
        "KL",
        "KL, sampler vs trainer",
        (
            Metric("kl/sample_train_v1", "kl v1 (mean Δlogprob)", "#0891b2"),
            Metric("kl/sample_train_v2", "kl v2 (mean Δ²/2)", "#7c3aed"),
        ),
        ("reward",),
    ),
    View("entropy", "nats per sampled token", (Metric("entropy", "entropy", "#ea580c"),), ("reward",)),
    View("grad norm", "gradient norm", (Metric("optim/grad_norm", "grad norm", "#0891b2"),), ("loss",)),
    View("learning rate", "learning rate", (Metric("learning_rate", "learning rate", "#65a30d"),), ("loss",)),
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
"""The other buttons of a run's chart, each for the curve kinds it applies to."""

CURVE_KEYS = tuple(view.metrics[0].key for view in CURVES.values())
"""The training curves' own keys (``reward/mean``, ``loss``): what `compare_runs` overlays first."""


def metric_definition(key: str, kind: CurveKind | None = None) -> Metric:
    """``key``'s definition: its entry in `CURVES` or `VIEWS`, else one named by its key, an ``eval/*`` one an
    evaluation (in an RL step record, of the policy the step started from, as ``eval/reward_mean``)."""
    for view in (*CURVES.values(), *VIEWS):
        for known in view.metrics:
            if known.key == key:
                return known
    evaluation = key.startswith("eval/")
    return Metric(key, key, GREY, evaluation=evaluation, before_step=evaluation and kind == "reward")


def curve_kind(recipe: str | None = None, keys: Collection[str] = ()) -> CurveKind | None:
    """Which training curve a run has: from its recipe when known (``rl``: reward, ``sft``: loss), else from the
    metric keys it logged (any reward key wins: an RL step may log a ``loss`` too); None while undecided."""
    if recipe in ("rl", "sft"):
        return "reward" if recipe == "rl" else "loss"
    for kind, view in CURVES.items():
        if any(m.key in keys for m in view.metrics):
            return kind
    return None


# -- one series' points, and how they are drawn -----------------------------------------------------------------


@dataclass
class Series:
    """One line's points: ``ys[i]`` at ``xs[i]`` (None is a gap); ``band`` (low, high) per point; ``hover`` the
    text per point."""

    name: str
    color: str
    xs: Sequence[int]
    ys: Sequence[float | None]
    hover: Sequence[str]
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None
    evaluation: bool = False

    def has_points(self) -> bool:
        return any(y is not None for y in self.ys)


def traces(series: Series, *, marker_size: int = 6) -> list[dict[str, Any]]:
    """The plotly traces of ``series``: its band (two fill traces, no legend) when it has one, then its line."""
    out: list[dict[str, Any]] = []
    common = {"type": "scatter", "x": list(series.xs), "legendgroup": series.name}
    if series.band is not None:
        lows, highs = series.band
        edge = {**common, "mode": "lines", "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False}
        out.append({**edge, "y": list(highs), "name": f"{series.name} high"})
        out.append({**edge, "y": list(lows), "name": f"{series.name} low", "fill": "tonexty"})
        out[-1]["fillcolor"] = _rgba(series.color, 0.15)
    out.append(
        {
            **common,
            "y": list(series.ys),
            "name": series.name,
            "mode": "lines+markers",
            "line": {"color": series.color, "dash": "dash" if series.evaluation else "solid"},
            "marker": {"size": marker_size},
            "text": list(series.hover),
            "hovertemplate": "%{text}<extra></extra>",
            "connectgaps": series.evaluation,
        }
    )
    return out


def series_table(series: Sequence[Series], *, title: str = "", max_rows: int = 40) -> str:
    """The points as an inline-styled table, one row per step and one column per series (hover a cell for its
    point): what a saved notebook shows where it runs no JavaScript (nbconvert HTML, GitHub). Past ``max_rows``
    steps, evenly spaced rows are kept, the last always."""
    drawn = [s for s in series if s.has_points()]
    steps = sorted({x for s in drawn for x, y in zip(s.xs, s.ys, strict=True) if y is not None})
    if len(steps) > max_rows:
        stride = -(-len(steps) // max_rows)
        steps = sorted({*steps[::stride], steps[-1]})
    cell = "padding:1px 8px;text-align:right;border-bottom:1px solid #e5e7eb;white-space:nowrap"
    rows = [
        tag("th", "step", cell) + "".join(tag("th", escape(s.name), f"{cell};color:{s.color}") for s in drawn)
    ]
    where = [{x: i for i, x in enumerate(s.xs)} for s in drawn]
    for step in steps:
        tds = tag("td", str(step), f"{cell};color:{GREY}")
        for s, index in zip(drawn, where, strict=True):
            at = index.get(step)
            if at is None or s.ys[at] is None:
                tds += tag("td", "", cell)
            else:
                tds += tag("td", fmt(s.ys[at]), cell, s.hover[at])
        rows.append(tds)
    caption = div(escape(title), "font-weight:600;margin:2px 0") if title else ""
    table = tag("table", "".join(tag("tr", r) for r in rows), "border-collapse:collapse")
    return div(caption + table, f"{FONT};color:#1f2328")


def _rgba(color: str, alpha: float) -> str:
    c = color.lstrip("#")
    r, g, b = (int(c[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"
