"""`StopControl`: a Stop button that sets the run's ``stop_event``, and the hand-off of a stop to the run's loop.

The loop (``project.train(observers=[live], stop=live.stop_event)``) checks the event between steps and saves a
checkpoint. Whether a click arrives while the cell is still running depends on the kernel. Verified with
ipykernel 7.4: a cell that *awaits* (``await project.train(...)``) has comm messages dispatched concurrently, so
the click lands at once; a cell that blocks without awaiting (``train_sync``) gets the click only after it
finishes. Older ipykernels (6.x) queue comm messages behind any running cell, await or not; running the loop as a
background task (`LiveRun.run_in_background`) works everywhere. When the run ends the button is replaced by a
static line, so no dead widget is saved with the notebook.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from loops_nb.widgets.environment import DisplayFn, DisplayHandle, TextLine

if TYPE_CHECKING:
    from ipywidgets import Button


class StopControl:
    """``stop_event`` is what the run checks (None: no button); ``display_fn`` shows the button and returns its
    handle."""

    def __init__(self, stop_event: asyncio.Event | None, *, display_fn: DisplayFn) -> None:
        self.stop_event = stop_event
        self.button: Button | None = None
        self._display_fn = display_fn
        self._handle: DisplayHandle | None = None

    def show(self, on_click: Callable[[], None]) -> None:
        """Display the button, once."""
        if self.button is not None or self.stop_event is None:
            return
        self.button = self.make_button(on_click)
        self._handle = self._display_fn(self.button, display_id=True)

    def make_button(self, on_click: Callable[[], None]) -> Button:
        import ipywidgets

        button = ipywidgets.Button(
            description="Stop",
            button_style="danger",
            icon="stop",
            tooltip="Stop at the next step boundary; a checkpoint is saved",
            layout=ipywidgets.Layout(width="auto", min_width="110px"),  # the label must never be cut
        )
        button.on_click(lambda _: on_click())
        return button

    def request(self, loop: asyncio.AbstractEventLoop | None, stop_here: Callable[[], None]) -> None:
        """Run ``stop_here`` on ``loop``, the loop the run waits on, whichever thread asks."""
        if self.stop_event is None:
            raise RuntimeError("this LiveRun has no stop_event: pass LiveRun(stop_event=asyncio.Event())")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        # asyncio.Event is not thread-safe: a click handled on another thread (a kernel subshell) hands the
        # whole stop over to the loop the run waits on.
        if loop is not None and running is not loop and not loop.is_closed():
            loop.call_soon_threadsafe(stop_here)
        else:
            stop_here()

    def set(self) -> None:
        """Set the event and say so on the button (on the run's loop)."""
        assert self.stop_event is not None
        self.stop_event.set()
        if self.button is not None:
            with contextlib.suppress(Exception):  # the kernel's comm may already be gone
                self.button.disabled = True
                self.button.description = "Stopping…"
                self.button.tooltip = "Stopping at the next step boundary; a checkpoint is saved"

    def retire(self, final_line: Callable[[], str]) -> None:
        """Replace the button by ``final_line()``, which needs no kernel to show."""
        if self.button is None:
            return
        with contextlib.suppress(Exception):  # the kernel's comm may already be gone
            self.button.disabled = True
            if self._handle is not None:
                self._handle.update(TextLine(final_line(), "#57606a"))
            self.button.close()
        self.button = None
