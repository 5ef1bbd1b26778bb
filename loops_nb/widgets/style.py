"""How the widgets write what they show: fonts and grey, a short number, a count of things, a sparkline, and the
inline-styled HTML tags (`tag`, `div`, `heading`) that JupyterLab's sanitizer keeps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

UI = "system-ui,sans-serif"
MONOSPACE = "ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"
GREY = "#6b7280"
FONT = f"font:11px {UI}"
_BLOCKS = "▁▂▃▄▅▆▇█"


def plural(n: int, word: str) -> str:
    """``1 step``, ``1,200 steps``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def fmt(value: object, digits: int = 4) -> str:
    """A short number: 0.7213, 1.2e+04, 12; '-' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e6):
        return str(int(value))
    return f"{value:.{digits}g}"


def sparkline(values: Sequence[float | None], width: int = 24) -> str:
    """Unicode blocks for a script's one-line view of a curve (the last ``width`` values)."""
    vals = [v for v in values[-width:] if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(_BLOCKS[min(7, int((v - lo) / span * 7.999))] for v in vals)


def tag(name: str, inner: str, style: str = "", title: str | None = None) -> str:
    """``<name title="…" style="…">inner</name>``: ``inner`` is HTML (escape text first), ``title`` plain text."""
    attrs = (f' title="{escape(title)}"' if title is not None else "") + (
        f' style="{style}"' if style else ""
    )
    return f"<{name}{attrs}>{inner}</{name}>"


def div(inner: str, style: str = "") -> str:
    return tag("div", inner, style)


def heading(title: str, note: str = "") -> str:
    """A widget's title line, in bold, and a grey ``note`` (HTML) after it."""
    grey = tag("span", f" · {note}", f"font-weight:400;color:{GREY}") if note else ""
    return div(escape(title) + grey, f"font:600 12px {UI};margin:2px 0")
