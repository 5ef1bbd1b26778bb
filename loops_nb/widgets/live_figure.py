"""`LiveFigure`: a plotly figure live in the notebook, as a small anywidget of our own.

The figure is a synced trait; on each change the view sends plotly only the traces' new ``x``, ``y`` and hover
``text`` (``Plotly.restyle``) and the x axis' tick step, never the layout or the traces' visibility, so a person's
zoom, pan and chosen view survive every update. plotly.js itself (``plotly.offline.get_plotlyjs()``) travels as
the ``plotly_js`` trait, loaded once per page; `retire` empties it before the widget closes, because papermill
(nbclient) saves every widget's last state in the notebook, closed or not, and the bundle is 5 MB.

plotly's own ``FigureWidget`` is the same idea, but its bundle sits in a private attribute that nothing public
empties. This module is imported only when a live chart is shown (anywidget takes a second to import); where
no widget can be built, `RunChart` shows its static figure instead.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anywidget
import traitlets
from plotly.offline import get_plotlyjs

_ESM = """
function plotly(model) {
  if (!globalThis.Plotly && model.get("plotly_js")) {
    const script = document.createElement("script");  // plotly.min.js sets window.Plotly
    script.textContent = model.get("plotly_js");
    document.head.appendChild(script);
  }
  return globalThis.Plotly;
}

export default {
  render({ model, el }) {
    const Plotly = plotly(model);
    if (!Plotly) { el.textContent = "plotly.js is not loaded"; return; }
    const figure = model.get("figure");
    Plotly.newPlot(el, figure.data, figure.layout, { responsive: true });
    const update = () => {
      const { data, layout } = model.get("figure");
      const names = (el.data || []).map((t) => t.name);
      if (names.length !== data.length || data.some((t, i) => t.name !== names[i])) {
        Plotly.react(el, data, layout);  // other traces (the curve kind was learnt): draw it anew
        return;
      }
      const pick = (key) => data.map((t) => t[key] ?? []);
      Plotly.restyle(el, { x: pick("x"), y: pick("y"), text: pick("text") }, data.map((_, i) => i));
      Plotly.relayout(el, { "xaxis.dtick": layout.xaxis?.dtick ?? null });
    };
    model.on("change:figure", update);
    return () => { model.off("change:figure", update); Plotly.purge(el); };
  },
};
"""


class LiveFigure(anywidget.AnyWidget):
    """``LiveFigure(figure=<a plotly figure dict>)``: assign a new ``figure`` to update the view."""

    _esm = _ESM
    figure = traitlets.Dict().tag(sync=True)
    plotly_js = traitlets.Unicode("").tag(sync=True)

    def __init__(self, figure: dict[str, Any]) -> None:
        super().__init__(figure=figure, plotly_js=get_plotlyjs())

    def __repr__(self) -> str:  # the default repr would print every trait, plotly.js included
        return f"LiveFigure({len(self.figure.get('data', []))} traces)"

    def retire(self) -> None:
        """Drop plotly.js from the widget's state, then close it."""
        with contextlib.suppress(Exception):  # the kernel's comm may already be gone
            self.plotly_js = ""
            self.close()
