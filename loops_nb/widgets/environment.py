"""Where output goes: a Jupyter kernel, a plain IPython shell, or a script; and a throttled live display.

`LiveDisplay` re-renders an object in place at most ``max_hz`` times a second, because each update re-sends the
whole output, and forces the last update, so a saved notebook (papermill, nbconvert, a reopen) holds the final
state. Outside a kernel the object's ``str()`` is printed at a low rate instead (CI logs want a line every half
minute). ``LOOPS_NB_PROGRESS=auto|text|off`` overrides the choice: papermill cannot be told apart from a person
at a notebook, so every path has to degrade gracefully rather than guess.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Literal, Protocol, TextIO, TypedDict, Unpack

from loops_nb.widgets.style import GREY, UI, div

log = logging.getLogger("loops_nb.widgets")

Environment = Literal["kernel", "ipython", "script"]
ProgressMode = Literal["auto", "text", "off"]
ENV_VAR = "LOOPS_NB_PROGRESS"
_MODES: tuple[ProgressMode, ...] = ("auto", "text", "off")


class DisplayHandle(Protocol):
    """What IPython's ``display(obj, display_id=True)`` returns, and a ``display_fn`` must: the output it made,
    which ``update`` re-renders in place."""

    def update(self, obj: object) -> None: ...


DisplayFn = Callable[..., DisplayHandle | None]
"""Called as ``display_fn(obj, display_id=True)``: IPython's ``display``, or a test's or another frontend's."""


def environment() -> Environment:
    """``kernel`` in a Jupyter kernel (Lab, VS Code, papermill, nbmake), ``ipython`` in a terminal IPython,
    else ``script``."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return "script"
    return "kernel" if type(shell).__name__ == "ZMQInteractiveShell" else "ipython"


def in_kernel() -> bool:
    return environment() == "kernel"


def progress_mode(mode: str | None = None) -> ProgressMode:
    """The requested mode: the argument if given, else ``$LOOPS_NB_PROGRESS``, else ``auto``."""
    value = (mode or os.environ.get(ENV_VAR) or "auto").strip().lower()
    for known in _MODES:  # the loop, not `in`, narrows the str to the Literal
        if value == known:
            return known
    log.warning("%s=%r is not one of %s; using auto", ENV_VAR, value, "|".join(_MODES))
    return "auto"


def resolve_output(mode: str | None = None, display_fn: object = None) -> Literal["display", "text", "off"]:
    """What a live object should do here: ``display`` (rich output through a handle), ``text`` or ``off``.
    An explicit ``display_fn`` is a frontend of its own, so ``auto`` then means ``display`` anywhere."""
    requested = progress_mode(mode)
    if requested == "auto":
        return "display" if display_fn is not None or in_kernel() else "text"
    return requested


class DisplayOptions(TypedDict, total=False):
    """A `LiveDisplay`'s options, which a widget's ``show(**options)`` passes on: ``max_hz`` (default 2),
    ``mode``, ``text_interval_s`` (default 30), ``stream``, ``display_fn``, ``output``, ``clock`` (a monotonic one)."""

    max_hz: float
    mode: str | None
    text_interval_s: float | None
    stream: TextIO | None
    display_fn: DisplayFn | None
    output: Literal["display", "text", "off"] | None
    clock: Callable[[], float]


class LiveDisplay:
    """Shows ``obj`` once and re-renders it in place, throttled (``options``: `DisplayOptions`).

    An ``update()`` that comes too soon marks the output stale and, when an event loop runs, schedules one
    trailing re-render, so the screen never lags by more than one interval even if updates stop (a long
    checkpoint save after the last step). ``text_interval_s=None`` prints nothing (callers that print their own
    lines); ``output`` skips the environment check.
    """

    def __init__(self, obj: object, **options: Unpack[DisplayOptions]) -> None:
        self.obj = obj
        max_hz = options.get("max_hz", 2.0)
        self.min_interval = 1.0 / max_hz if max_hz > 0 else 0.0
        self._display_fn = options.get("display_fn")
        self.output = options.get("output") or resolve_output(options.get("mode"), self._display_fn)
        self.text_interval_s = options.get("text_interval_s", 30.0)
        self.stream = options.get("stream")
        self.handle: DisplayHandle | None = None
        self.renders = 0  # how many times the object was rendered (display + updates, or printed lines)
        self._clock = options.get("clock", time.monotonic)
        self._last = -float("inf")
        self._stale = False
        self._timer: asyncio.TimerHandle | None = None
        self.shown = False

    def show(self) -> LiveDisplay:
        """Display the object (once; later calls do nothing)."""
        if self.shown:
            return self
        self.shown = True
        if self.output == "display":
            display_fn = self._display_fn or ipython_display
            self.handle = display_fn(self.obj, display_id=True)
            self.renders += 1
        elif self.output == "text" and self.text_interval_s is not None:
            self._print()
        self._last = self._clock()
        return self

    def update(self, *, force: bool = False) -> bool:
        """Re-render if the last render is at least one interval old (or ``force``); returns whether it did."""
        if not self.shown:
            self.show()
            return True
        if self.output == "off":
            return False
        interval = self.min_interval if self.output == "display" else (self.text_interval_s or 0.0)
        if self.output == "text" and self.text_interval_s is None:
            return False
        wait = self._last + interval - self._clock()
        if not force and wait > 0:
            self._stale = True
            self._schedule(wait)
            return False
        self._render()
        return True

    def finalize(self) -> None:
        """Render the final state, whatever the throttle says; in text mode only if something changed."""
        self._cancel()
        if not self.shown:
            self.show()
            return
        printing = self.output == "text" and self.text_interval_s is not None
        if self.output == "display" or (printing and self._stale):
            self._render()

    # -- internals -----------------------------------------------------------------------------------------

    def _render(self) -> None:
        self._cancel()
        self._stale = False
        self._last = self._clock()
        if self.output == "display" and self.handle is not None:
            self.handle.update(self.obj)
            self.renders += 1
        elif self.output == "text":
            self._print()

    def _print(self) -> None:
        print(str(self.obj), file=self.stream or sys.stdout, flush=True)
        self.renders += 1

    def _schedule(self, delay: float) -> None:
        # A trailing re-render needs a running loop; without one (a synchronous script) the next update() or
        # finalize() catches up instead.
        if self._timer is not None or self.output != "display":
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self._stale:
            try:
                self._render()
            except Exception:  # a display glitch must never surface in the training loop's callbacks
                log.exception("live display update failed")

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Widget:
    """The shape every widget here shares: a one-line `summary` (``text/plain``, and the repr), `to_html` (the
    inline-styled ``text/html``) and `show`, which displays it through a `LiveDisplay`."""

    def summary(self) -> str:
        raise NotImplementedError

    def to_html(self) -> str:
        raise NotImplementedError

    def plain_text(self) -> str:
        """What a frontend without HTML shows: the summary, unless a widget has more to say in plain text."""
        return self.summary()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.summary()}>"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, object]:
        return {"text/plain": self.plain_text(), "text/html": self.to_html()}

    def show(self, **options: Unpack[DisplayOptions]) -> LiveDisplay:
        return LiveDisplay(self, **options).show()


@dataclass(repr=False, eq=False)
class TextLine(Widget):
    """One grey line of text, left where a live part was (a retired Stop button, a folded step of attempts)."""

    text: str
    colour: str = GREY

    def summary(self) -> str:
        return self.text

    def to_html(self) -> str:
        return div(escape(self.text), f"font:12px {UI};color:{self.colour}")


def ipython_display(obj: object, *, display_id: bool = True) -> DisplayHandle | None:
    """IPython's ``display``, imported only when something is displayed."""
    from IPython.display import display

    return display(obj, display_id=display_id)
