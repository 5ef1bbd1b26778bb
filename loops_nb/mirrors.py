"""Observers that mirror a run elsewhere: Weights & Biases (`[output] wandb_project`, the `wandb`
extra) and a rich live progress region in the terminal (`[output] console`, the `console` extra)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loops_nb.config.sections import OutputConfig
from loops_nb.errors import UserError
from loops_nb.observers import TerminalReporter, eta, shown
from loops_nb.run_events import EvalRecord, MetricsLine, ProgressTick, RunEnded, RunStarted, StepRecord

if TYPE_CHECKING:
    from rich.table import Table
    from wandb.sdk.wandb_run import Run


class WandbMirror:
    """Logs every step record to a W&B run named after the run directory."""

    def __init__(self, project: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("output.wandb_project needs the wandb extra: uv sync --extra wandb") from None
        self._wandb = wandb
        self._config = config
        self._run: Run | None = None
        self.project = project

    def on_start(self, started: RunStarted) -> None:
        name = os.path.basename(started.run_dir or "") or None
        self._run = self._wandb.init(
            project=self.project, name=name, config=self._config, resume="allow", id=name
        )

    def on_step(self, record: StepRecord) -> None:
        self._log(record, "")

    def on_eval(self, evaluation: EvalRecord) -> None:
        """An RL evaluation, at the steps its policy had (the final one follows the last step record)."""
        self._log(evaluation, "eval/")

    def _log(self, line: MetricsLine, prefix: str) -> None:
        if self._run is not None:
            numbers = {
                k: v for k in line.metrics if k.startswith(prefix) and (v := line.number(k)) is not None
            }
            self._run.log(numbers, step=line.step)

    def on_end(self, ended: RunEnded) -> None:
        if self._run is not None:
            self._run.summary.update(ended.to_json())
            self._run.finish()


class RichConsole(TerminalReporter):
    """A live progress region (step bar with ETA and the latest health numbers) instead of plain lines."""

    def __init__(self) -> None:
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:
            raise UserError("output.console needs the console extra: uv sync --extra console") from None
        super().__init__()
        self._console = Console()
        self._live = Live(console=self._console, refresh_per_second=2, transient=False)
        self._last: StepRecord | None = None

    def _render(self, note: str = "") -> Table:
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        step = self._last.step + 1 if self._last is not None else 0
        elapsed = time.monotonic() - self.started
        table.add_row(
            f"[bold]step {step}/{self.total or '?'}[/]", f"eta {eta(step, self.total, elapsed)}", note
        )
        for key in self.KEYS:
            value = self._last.metrics.get(key) if self._last is not None else None
            if value is not None:
                table.add_row(key, shown(value), "")
        return table

    def on_start(self, started: RunStarted) -> None:
        super().on_start(started)
        self._live.start()
        self._live.update(self._render("starting"))

    def on_step(self, record: StepRecord) -> None:
        self._last = record
        self._live.update(self._render())

    def on_progress(self, tick: ProgressTick) -> None:
        self._live.update(self._render(", ".join(f"{k}={v}" for k, v in tick.to_json().items())))

    def on_end(self, ended: RunEnded) -> None:
        self._live.update(self._render(ended.status))
        self._live.stop()


def run_observers(
    output: OutputConfig, config_dump: dict[str, Any], observers: Sequence[object] | None = None
) -> list[object]:
    """The caller's observers (when it passes none, `[output]`'s: the terminal, or rich), plus W&B whenever
    wandb_project is set."""
    if observers is None:
        observers = [RichConsole() if output.console else TerminalReporter()]
    if output.wandb_project:
        return [*observers, WandbMirror(output.wandb_project, config_dump)]
    return list(observers)
