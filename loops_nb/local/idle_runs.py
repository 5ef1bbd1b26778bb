"""Idle runs on a long-lived `loops serve` move their trainer to disk, and come back on their next call.

A run left open in a notebook holds its adapter, its gradient buffers and AdamW's two moments forever.
`IdleRunReaper` saves that state (the trainer's own `save_state`) after `idle_seconds` without a trainer op
and drops the trainer; the run's next op reloads it, so only that op is slower. A run with gradients
waiting for `optim_step` is never moved, and the move runs on the run's op queue, never racing its ops.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loops_nb.local.local_run import LocalRun
    from loops_nb.local.trainer import LoraTrainer

log = logging.getLogger(__name__)

PARKED = "parked-trainer"
"""The directory under a run's state directory that holds a moved trainer (not a user checkpoint)."""


def park(run: LocalRun) -> bool:
    """Save an idle run's trainer to disk and drop it (on the run's op worker). Returns whether it moved."""
    trainer = run.trainer
    if trainer is None or trainer.has_pending_gradients or run.ops.idle_for() is None:
        return False
    trainer.save_state(run.directory / PARKED)
    run.parked_step = trainer.step
    run.trainer = None
    log.info("run %s was idle: its trainer moved to %s", run.id, run.directory / PARKED)
    return True


def unpark(run: LocalRun, new_trainer: Callable[[LocalRun], LoraTrainer]) -> LoraTrainer:
    """The run's trainer, reloaded from where `park` put it (adapter, optimizer and step) into a fresh one
    from `new_trainer` (`LocalLoopsState.new_trainer`)."""
    path: Path = run.directory / PARKED
    trainer = new_trainer(run)
    trainer.load_state(path, with_optimizer=True, restore_rng=False)
    run.trainer, run.parked_step = trainer, None
    log.info("run %s is back from %s at step %d", run.id, path, trainer.step)
    return trainer


class IdleRunReaper:
    """A daemon thread that parks every run idle for longer than `idle_seconds`; `runs` gives the server's
    runs afresh at each sweep."""

    def __init__(self, runs: Callable[[], Iterable[LocalRun]], idle_seconds: float) -> None:
        self.runs = runs
        self.idle_seconds = idle_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loops-idle-runs", daemon=True)
        self._thread.start()

    def sweep(self) -> list[str]:
        """Park the runs idle for too long now; returns their ids."""
        moved = []
        for run in list(self.runs()):
            idle = run.ops.idle_for()
            if not run.active or run.trainer is None or idle is None or idle < self.idle_seconds:
                continue
            try:
                if run.ops.run_quietly(functools.partial(park, run)):
                    moved.append(run.id)
            except Exception:  # a full disk: the run stays in memory, as it was
                log.exception("could not move idle run %s to disk", run.id)
        return moved

    def _loop(self) -> None:
        while not self._stop.wait(min(60.0, max(1.0, self.idle_seconds / 4))):
            self.sweep()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
