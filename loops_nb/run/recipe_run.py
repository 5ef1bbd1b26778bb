"""`RecipeRun`: the step loop both recipes share — resume, step, stop, checkpoint, fail, finish.

Exactly-once: a checkpoint at ``k`` means steps ``0..k-1`` were applied. `resume_point` loads the last one
with the optimizer state and cuts the logs back to it; `execute` then runs steps ``k..total-1``, saving
every ``save_every`` steps and, at the end (or when stopped), the final checkpoint with the sampler
weights. Any failure after the first step is a `RunFailed` naming the step and the checkpoint a rerun
resumes from. A recipe supplies `train_step` and overrides the hooks it needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loops_nb.errors import RunFailed, UserError, describe_cause
from loops_nb.observers import ObserverSet
from loops_nb.process_memory import process_memory
from loops_nb.run.run_outcome import Outcome
from loops_nb.run_dir import Checkpoint, RunDirectory
from loops_nb.run_events import RunEnded, StepRecord

if TYPE_CHECKING:
    from baseten.loops import TrainingClient

log = logging.getLogger(__name__)


class RecipeRun(ABC):
    """One process's part of a run: from its resume point to its final checkpoint."""

    outcome_type: type[Outcome] = Outcome
    """What `execute` returns (a recipe may extend `Outcome` with fields of its own)."""

    def __init__(
        self,
        run_dir: RunDirectory,
        training_client: TrainingClient,
        observers: ObserverSet,
        *,
        total_steps: int,
        save_every: int,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.trainer = training_client
        """The Loops training client."""
        self.observers = observers
        self.total_steps = total_steps
        self.save_every = save_every
        self.stop = stop or asyncio.Event()
        self.sampler_counters: Callable[[], Mapping[str, int] | None] = lambda: None
        """The Loops' sampler counters when it reports them (the embedded one): RL records their change
        per step (`sampler/prefill_tokens`, `sampler/prefix_cached_tokens`)."""

    @abstractmethod
    async def train_step(self, step: int) -> StepRecord:
        """Produce step ``step``'s data and train one optimizer step on it; returns what it logs."""

    async def begin(self, start: int) -> None:
        """Before the first step of this process (RL: tasks, the scheduler, the first publish)."""
        return None

    async def end(self) -> None:
        """After the last step, whether the loop finished, stopped or failed (RL: stop the scheduler)."""
        return None

    async def when_stopped(self, step: int, start: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics to report for a run stopped after ``step`` steps (SFT measures its held-out loss)."""
        return metrics

    async def when_completed(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """After the last step, before the final checkpoint: the metrics to report for the completed run (RL
        evaluates the final policy). A failure here is the run's, resumable like a step's."""
        return metrics

    async def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Load a checkpoint's trainer state with its optimizer state."""
        future = await self.trainer.load_state_with_optimizer_async(checkpoint.path)
        await future.result_async()

    def rewind(self, step: int) -> None:
        """Forget every record past ``step`` (a recipe with logs of its own cuts them too)."""
        self.run_dir.rewind_to(step)

    def start_over(self) -> None:
        """Forget every record: the run was killed before its first checkpoint, and the fresh trainer starts
        over from step 0 (`rewind` to 0, unless a recipe forgets more)."""
        self.rewind(0)

    def policy_version(self) -> int | None:
        """The policy version a checkpoint records besides its step and paths (RL's; None in SFT)."""
        return None

    def trained_nothing(self) -> str | None:
        """Why the steps this process ran trained on nothing, or None. RL: every attempt was discarded. Such a
        run ends `failed` with this reason (and a non-zero exit) although no step raised."""
        return None

    async def resume_point(self) -> int:
        """Load the last checkpoint and cut the logs back to it; 0 for a fresh run (or one killed before its
        first checkpoint, whose logs are redone from step 0)."""
        checkpoint = self.run_dir.last_checkpoint()
        if checkpoint is None:
            self.start_over()
            return 0
        await self.load_checkpoint(checkpoint)
        self.rewind(checkpoint.step)
        log.info("resuming %s at step %d from %s", self.run_dir.root, checkpoint.step, checkpoint.path)
        return checkpoint.step

    async def execute(self, start: int) -> Outcome:
        """Run steps ``start..total_steps-1`` (or until `stop` is set) and save the final checkpoint. A finished
        run never gets here: `run_recipe` answers it from its files (`Recipe.finished`)."""
        started = time.monotonic()
        try:
            await self.begin(start)
        except UserError:
            await self.end()
            raise
        except Exception as exc:
            # The recipe's own setup failed (a runtime's tasks()): resumable, like a trainer fault.
            await self.end()
            raise self.failed(start, exc) from exc
        status, step = "completed", start
        metrics: dict[str, Any] = {}
        try:
            for step in range(start, self.total_steps):
                if self.stop.is_set():
                    status = "stopped"
                    break
                # Memory beside the timings: it is what stops runs on a laptop (the panel charts it).
                record = (await self.train_step(step)).with_metrics(process_memory())
                self.run_dir.steps.append(record.to_json())
                self.observers.emit(record)
                metrics = record.to_json()
                done = step + 1
                if self.save_every and done % self.save_every == 0 and done < self.total_steps:
                    await self.save(done, sampler=False)
            else:
                step = self.total_steps
            if status == "completed":
                metrics = await self.when_completed(step, metrics)
            reason = self.trained_nothing() if step > start else None
            if reason is not None:  # it ran to the end, and trained on none of it: not a success
                status = "failed"
        except Exception as exc:
            raise self.failed(step, exc) from exc
        finally:
            await self.end()
        if status == "stopped" and step > start:
            metrics = await self.when_stopped(step, start, metrics)
        try:
            checkpoint = await self.save(step, sampler=True)
        except Exception as exc:  # e.g. a full disk or a restarted Loops: the last periodic checkpoint stands
            raise self.failed(step, exc) from exc
        seconds = time.monotonic() - started
        outcome = self.outcome_type.of(self.run_dir, checkpoint, status, start, metrics, seconds, reason)
        if reason is not None:
            self.run_dir.note_failure(reason)
        self.observers.emit(RunEnded(status, step, outcome.seconds, reason=reason, error=reason))
        return outcome

    def failed(self, step: int, exc: BaseException) -> RunFailed:
        # Raised, not logged: the CLI prints it once, train() raises it, and run.log gets the traceback.
        failure = self.run_dir.record_failure(step, exc)
        # Observers hear a failed run end too: a live panel stops its clock and says how to resume.
        self.observers.emit(
            RunEnded("failed", step, error=describe_cause(exc), resume_step=failure.resume_step)
        )
        return failure

    async def save(self, step: int, *, sampler: bool) -> Checkpoint:
        """Save the trainer state after ``step`` steps (and the sampler weights) and record it."""
        future = await self.trainer.save_state_async(f"state-{step:06d}")
        path = str((await future.result_async()).path)
        sampler_path = None
        if sampler:
            future = await self.trainer.save_weights_for_sampler_async(f"final-{step:06d}")
            sampler_path = str((await future.result_async()).path)
        checkpoint = Checkpoint(step, path, sampler_path, self.policy_version())
        self.run_dir.record_checkpoint(checkpoint)
        return checkpoint
