"""Plotly figures for the curve widgets: the ``application/vnd.plotly.v1+json`` member of their mimebundles.

JupyterLab (live, and when it reopens a saved notebook, trusted or not), VS Code and nteract render this mime
type with their own plotly.js, so the chart stays interactive with the final data and no widget state. plotly is
imported only when a figure is built.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from loops_nb.widgets.svg_chart import Series, ok


def plotly_figure(
    series: Sequence[Series], *, title: str = "", x_label: str = "step", y_label: str = ""
) -> dict[str, Any]:
    """A JSON-ready plotly figure dict (built and validated by ``plotly.graph_objects``)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for s in series:
        if s.band is not None:
            lows, highs = s.band
            common = {
                "x": list(s.xs),
                "mode": "lines",
                "line": {"width": 0},
                "hoverinfo": "skip",
                "showlegend": False,
                "legendgroup": s.name,
            }
            fig.add_trace(go.Scatter(y=_clean(highs), name=f"{s.name} high", **common))
            fig.add_trace(
                go.Scatter(
                    y=_clean(lows),
                    name=f"{s.name} low",
                    fill="tonexty",
                    fillcolor=_rgba(s.color, 0.15),
                    **common,
                )
            )
        hover = [s.hover_text(i) for i in range(len(s.xs))]
        fig.add_trace(
            go.Scatter(
                x=list(s.xs),
                y=_clean(s.ys),
                name=s.name,
                mode="lines+markers",
                legendgroup=s.name,
                line={"color": s.color, "dash": "dash" if s.dash else "solid"},
                marker={"size": 6},
                text=hover,
                hovertemplate="%{text}<extra></extra>",
                connectgaps=s.connect_gaps,
            )
        )
    fig.update_layout(
        title={"text": title},
        xaxis_title=x_label,
        yaxis_title=y_label,
        template="plotly_white",
        height=320,
        margin={"l": 60, "r": 20, "t": 40, "b": 45},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
    )
    # A JSON round trip makes the dict exactly what the frontend receives (no numpy or tuples left).
    return json.loads(json.dumps(fig.to_dict()))


def plotly_bundle(figure: dict[str, Any]) -> dict[str, Any]:
    """The mimebundle entry plotly's ``plotly_mimetype`` renderer would emit (without importing plotly.io,
    whose renderer registry takes seconds to load)."""
    return {"application/vnd.plotly.v1+json": {"data": figure["data"], "layout": figure["layout"]}}


def _clean(values: Sequence[float | None]) -> list[float | None]:
    return [v if ok(v) else None for v in values]


def _rgba(color: str, alpha: float) -> str:
    c = color.lstrip("#")
    r, g, b = (int(c[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"
