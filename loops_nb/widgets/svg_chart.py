"""Small line charts for the curve widgets: inline SVG, sanitizer-proof HTML dots, and plotly figure dicts.

Three forms of the same series, because each survives somewhere the others do not:

- `svg_chart`: inline SVG with one ``<circle>`` per point (a ``<title>`` child is the hover text), a line, and
  a shaded band. Renders in live JupyterLab, VS Code and ``nbconvert --to html`` (offline). JupyterLab 4.6's
  sanitizer, which runs on untrusted notebooks (every papermill output), does not allow ``<svg>``: there the
  curve widgets' plotly JSON is what Lab shows.
- `dot_chart`: the same points as absolutely positioned ``<div>``s with ``title`` attributes, using only tags and
  style properties Lab's sanitizer keeps, for composite panels (`LiveRun`) that cannot carry plotly JSON.
- `plotly_chart.plotly_figure`: a plotly figure dict, for the ``application/vnd.plotly.v1+json`` renderer.

All styling is inline (no ``<style>``, no ``<script>``, no ``data-*``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TypeGuard

FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:11px"
MUTED = "#6b7280"
GRID = "#e5e7eb"
_BLOCKS = "▁▂▃▄▅▆▇█"


@dataclass
class Series:
    """One line: ``ys[i]`` at ``xs[i]`` (None leaves a gap); ``band`` is (low, high) per point; ``hover`` the
    text per point (default ``"<name> <y> at step <x>"``); ``connect_gaps`` draws the line across missing values
    (eval loss, logged every few steps)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str = "#2563eb"
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None
    hover: Sequence[str] | None = None
    dash: bool = False
    connect_gaps: bool = False

    def points(self) -> list[tuple[int, float, float]]:
        """(index, x, y) of the points that have a value."""
        return [(i, x, y) for i, (x, y) in enumerate(zip(self.xs, self.ys, strict=True)) if ok(y)]

    def hover_text(self, i: int) -> str:
        if self.hover is not None:
            return self.hover[i]
        return f"{self.name} {fmt(self.ys[i])} at step {fmt(self.xs[i])}"


def fmt(value: object, digits: int = 4) -> str:
    """A short number: 0.7213, 1.2e+04, 12; '-' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e6):
        return str(int(value))
    return f"{value:.{digits}g}"


def sparkline(values: Sequence[float | None], width: int = 24) -> str:
    """Unicode blocks for a script's one-line view of a curve (the last ``width`` values)."""
    vals = [v for v in values[-width:] if ok(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(_BLOCKS[min(7, int((v - lo) / span * 7.999))] for v in vals)


# -- inline SVG -----------------------------------------------------------------------------------------------


def svg_chart(
    series: Sequence[Series],
    *,
    title: str = "",
    x_label: str = "step",
    y_label: str = "",
    width: int = 520,
    height: int = 220,
    max_points: int = 400,
) -> str:
    """An SVG chart of ``series``. Past ``max_points`` points a series' circles are thinned (the line is not)."""
    left, right, top, bottom = 56, 14, 26, 38
    frame = _Frame(series, left, width - right, top, height - bottom)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{FONT};background:#fff">'
    ]
    for tick in _ticks(frame.y0, frame.y1):
        y = frame.py(tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 3.5:.1f}" text-anchor="end" fill="{MUTED}">{fmt(tick, 3)}</text>'
        )
    for tick in _ticks(frame.x0, frame.x1, integer=True):
        x = frame.px(tick)
        out.append(
            f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle" fill="{MUTED}">{fmt(tick)}</text>'
        )
    out.append(
        f'<polyline points="{left},{top} {left},{height - bottom} {width - right},{height - bottom}" '
        f'fill="none" stroke="{MUTED}"/>'
    )
    out.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="{MUTED}">'
        f"{escape(x_label)}</text>"
    )
    if y_label:
        cy = (top + height - bottom) / 2
        out.append(
            f'<text x="14" y="{cy:.0f}" text-anchor="middle" fill="{MUTED}" '
            f'transform="rotate(-90 14 {cy:.0f})">{escape(y_label)}</text>'
        )
    if title:
        out.append(f'<text x="{left}" y="16" font-weight="600" fill="#111827">{escape(title)}</text>')
    legend_x = width - right
    for s in reversed(series):  # right-aligned legend, last series rightmost
        label = escape(s.name)
        legend_x -= 7 * len(s.name) + 26
        out.append(
            f'<line x1="{legend_x}" y1="12" x2="{legend_x + 14}" y2="12" stroke="{s.color}" '
            f'stroke-width="2"{_dash(s)}/><text x="{legend_x + 18}" y="16" fill="#374151">{label}</text>'
        )
    for s in series:
        out.extend(_svg_band(s, frame))
    for s in series:
        for run in [s.points()] if s.connect_gaps else _runs(s.points()):
            pts = " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for _, x, y in run)
            out.append(
                f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="1.5"{_dash(s)}/>'
            )
    for s in series:
        for i, x, y in _thin(s.points(), max_points):
            out.append(
                f'<circle cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="3" fill="{s.color}">'
                f"<title>{escape(s.hover_text(i))}</title></circle>"
            )
    out.append("</svg>")
    return "".join(out)


def _svg_band(s: Series, frame: _Frame) -> list[str]:
    if s.band is None:
        return []
    lows, highs = s.band
    pts = [(x, lo, hi) for x, lo, hi in zip(s.xs, lows, highs, strict=True) if ok(lo) and ok(hi)]
    if not pts:
        return []
    upper = [f"{frame.px(x):.1f},{frame.py(hi):.1f}" for x, _, hi in pts]
    lower = [f"{frame.px(x):.1f},{frame.py(lo):.1f}" for x, lo, _ in reversed(pts)]
    if len(pts) == 1:  # a band of one point is a short vertical bar
        x = frame.px(pts[0][0])
        return [
            f'<line x1="{x:.1f}" y1="{frame.py(pts[0][2]):.1f}" x2="{x:.1f}" y2="{frame.py(pts[0][1]):.1f}" '
            f'stroke="{s.color}" stroke-opacity="0.3" stroke-width="6"/>'
        ]
    return [
        f'<polygon points="{" ".join(upper + lower)}" fill="{s.color}" fill-opacity="0.15" stroke="none"/>'
    ]


def _dash(s: Series) -> str:
    return ' stroke-dasharray="5,3"' if s.dash else ""


# -- positioned <div>s (survive JupyterLab's HTML sanitizer) ---------------------------------------------------


def dot_chart(
    series: Sequence[Series], *, title: str = "", width: int = 520, height: int = 160, max_columns: int = 200
) -> str:
    """Points (and band bars) as absolutely positioned ``<div>``s with ``title`` hovers; no SVG, no lines."""
    left, right, top, bottom = 48, 10, 20, 18
    frame = _Frame(series, left, width - right, top, height - bottom)
    out = [f'<div style="position:relative;width:{width}px;height:{height}px;{FONT};background:#fff">']
    if title:
        out.append(
            f'<div style="position:absolute;left:{left}px;top:2px;font-weight:600;color:#111827">'
            f"{escape(title)}</div>"
        )
    for tick in _ticks(frame.y0, frame.y1, 4):
        y = frame.py(tick)
        out.append(
            f'<div style="position:absolute;left:0;width:{left - 6}px;top:{y - 7:.0f}px;'
            f'text-align:right;color:{MUTED}">{fmt(tick, 3)}</div>'
            f'<div style="position:absolute;left:{left}px;top:{y:.0f}px;width:{width - left - right}px;'
            f'height:0;border-top:1px solid {GRID}"></div>'
        )
    out.append(
        f'<div style="position:absolute;left:{left}px;top:{top}px;width:{width - left - right}px;'
        f"height:{height - top - bottom}px;border-left:1px solid {MUTED};"
        f'border-bottom:1px solid {MUTED}"></div>'
    )
    for tick, anchor in ((frame.x0, "left"), (frame.x1, "right")):
        pos = f"left:{left}px" if anchor == "left" else f"right:{right}px"
        out.append(f'<div style="position:absolute;{pos};bottom:0;color:{MUTED}">step {fmt(tick)}</div>')
    drawn = [s for s in series if s.points()]
    if len(drawn) > 1:  # which dots are which: the eval dots once had no legend
        keys = "".join(
            f'<span style="margin-left:10px;white-space:nowrap"><span style="display:inline-block;width:6px;'
            f'height:6px;border-radius:50%;{_dot_fill(s)};margin-right:4px"></span>{escape(s.name)}</span>'
            for s in drawn
        )
        out.append(f'<div style="position:absolute;right:{right}px;top:2px;color:#374151">{keys}</div>')
    for s in series:
        points = _thin(s.points(), max_columns)
        if s.band is not None:
            lows, highs = s.band
            for i, x, _ in points:
                lo, hi = lows[i], highs[i]
                if ok(lo) and ok(hi):
                    y_hi, y_lo = frame.py(hi), frame.py(lo)
                    out.append(
                        f'<div style="position:absolute;left:{frame.px(x) - 1.5:.1f}px;top:{y_hi:.1f}px;'
                        f"width:3px;height:{max(y_lo - y_hi, 1):.1f}px;background:{s.color};"
                        f'opacity:0.25"></div>'
                    )
        for i, x, y in points:
            out.append(
                f'<div title="{escape(s.hover_text(i))}" style="position:absolute;'
                f"left:{frame.px(x) - 3:.1f}px;top:{frame.py(y) - 3:.1f}px;width:6px;height:6px;"
                f'border-radius:50%;{_dot_fill(s)}"></div>'
            )
    out.append("</div>")
    return "".join(out)


def _dot_fill(s: Series) -> str:
    """Solid dots for a series, rings for a dashed one (eval): told apart without colour too."""
    if s.dash:
        return f"box-sizing:border-box;border:2px solid {s.color};background:#fff"
    return f"background:{s.color}"


# -- geometry -------------------------------------------------------------------------------------------------


class _Frame:
    """Data → pixel mapping over the union of all series' points and bands."""

    def __init__(
        self, series: Sequence[Series], left: float, right: float, top: float, bottom: float
    ) -> None:
        xs = [x for s in series for _, x, _ in s.points()]
        ys = [y for s in series for _, _, y in s.points()]
        for s in series:
            if s.band is not None:
                ys += [v for part in s.band for v in part if ok(v)]
        self.x0, self.x1 = _pad(min(xs, default=0.0), max(xs, default=1.0), integer=True)
        self.y0, self.y1 = _pad(min(ys, default=0.0), max(ys, default=1.0))
        self.left, self.right, self.top, self.bottom = left, right, top, bottom

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _pad(lo: float, hi: float, *, integer: bool = False) -> tuple[float, float]:
    if hi > lo:
        if integer:
            return lo, hi
        margin = (hi - lo) * 0.06
        return lo - margin, hi + margin
    # One point, or a flat line: centre it in a range that still shows its value.
    if integer:  # steps: never label an axis "step -1"
        return (lo - 1.0 if lo >= 1 else lo), hi + 1.0
    half = 1.0 if lo == 0 else abs(lo) * 0.1
    return lo - half, hi + half


def _ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    raw = (hi - lo) / max(n - 1, 1)
    if raw <= 0:
        return [lo]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step) * step
    out: list[float] = []
    while first <= hi + 1e-9 * step and len(out) < 20:
        out.append(round(first, 12))
        first += step
    return out


def _runs(points: list[tuple[int, float, float]]) -> list[list[tuple[int, float, float]]]:
    """Consecutive points (by index): a missing value breaks the line."""
    runs: list[list[tuple[int, float, float]]] = []
    for p in points:
        if runs and runs[-1][-1][0] == p[0] - 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _thin(points: list[tuple[int, float, float]], limit: int) -> list[tuple[int, float, float]]:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    kept = points[::stride]
    return kept if kept[-1] is points[-1] else [*kept, points[-1]]


def ok(v: object) -> TypeGuard[float]:
    """A finite number (None, NaN and infinities are gaps)."""
    return v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))
