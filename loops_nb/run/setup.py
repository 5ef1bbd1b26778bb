"""`run_recipe`: everything before a recipe's first step, shared by RL and SFT.

In order: the run directory; the config-drift check against a resumed run's run.json and the run lock
(a refused run edits nothing); run.log's header; the observers; a finished run answered from its files
(no Loops client: on a dedicated scope one could provision billable capacity for nothing); the Loops
connection and training client; run.json (its ``run_id`` is the first attempt's, never replaced); the
recipe's `RecipeRun`, resumed from its last checkpoint. Whatever happens, what was opened is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loops_nb.compute import LoopsConnection
from loops_nb.config.sections import RecipeConfig
from loops_nb.config_drift import resume_drift
from loops_nb.errors import UserError
from loops_nb.mirrors import run_observers
from loops_nb.model_renderer import renderer_record
from loops_nb.observers import ObserverSet
from loops_nb.resources import RunLock
from loops_nb.run.recipe_run import RecipeRun
from loops_nb.run.run_outcome import Outcome
from loops_nb.run_dir import Checkpoint, RunDirectory, RunJson
from loops_nb.run_events import RunEnded, RunStarted

if TYPE_CHECKING:
    from baseten.loops import TrainingClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunStart:
    """What a recipe builds its `RecipeRun` from, once the lock is held and the training client is open."""

    run_dir: RunDirectory
    training_client: TrainingClient
    observers: ObserverSet
    stop: asyncio.Event | None


class Recipe(ABC):
    """What a recipe tells the skeleton before any Loops client exists."""

    name: str
    """`rl` or `sft`: run.json's `recipe`, the drift check's rules."""
    train_more: str = "raise training.max_steps"
    """How to train a finished run further (said when a rerun finds it complete)."""
    outcome_type: type[Outcome] = Outcome
    """What a run found finished returns (its `RecipeRun`'s `outcome_type`)."""

    def __init__(self, config: RecipeConfig, config_path: Path, *, seed: int) -> None:
        self.config = config
        self.config_path = config_path
        self.seed = seed
        """The trainer's seed (its LoRA initialisation)."""
        self.config_dump: dict[str, object] = json.loads(config.model_dump_json())

    @property
    @abstractmethod
    def total_steps(self) -> int:
        """Optimizer steps the run makes in all."""

    @abstractmethod
    async def start(self, run: RunStart) -> RecipeRun:
        """Build the recipe's `RecipeRun`."""

    async def prepare(self, run_dir: RunDirectory) -> None:
        """With the lock held, before the Loops connection (RL binds its runtime to the run's state)."""
        return None

    async def close(self) -> None:
        """Release what the recipe opened before the skeleton started (RL: its runtime)."""
        return None

    def header_lines(self) -> list[str]:
        """Lines run.log gets after the config's description and any drift (SFT: its plan)."""
        return []

    def warnings(self) -> list[str]:
        """Warnings logged and written to run.log at the start (SFT: no held-out example)."""
        return []

    def run_record(self) -> RunJson:
        """What run.json records besides the recipe, model, scope and config (SFT: a data summary)."""
        return {}

    def finished(self, run_dir: RunDirectory, checkpoint: Checkpoint) -> Outcome:
        """The outcome of a run whose files show it complete, read from them (`outcome_type`): nothing is trained,
        evaluated or saved, and no Loops client exists. A recipe may refuse the rerun (SFT: a changed plan)
        before any event."""
        return self.outcome_type.of(run_dir, checkpoint)


async def run_recipe(
    recipe: Recipe,
    project_lines: list[str],
    *,
    observers: Sequence[object] | None,
    stop: asyncio.Event | None,
) -> Outcome:
    """Set the run up, resume it and run it to its end; ``project_lines``: run.log's header."""
    config = recipe.config
    try:
        run_dir = RunDirectory.create(
            config.output.output_dir, config.output.run_name, recipe.config_path.stem
        )
        resumed = run_dir.read_run_json()
        drift = resume_drift(recipe.name, resumed, recipe.config_dump, str(run_dir.root))
        lock = RunLock.claim(run_dir.root)
    except BaseException:
        await recipe.close()
        raise
    try:
        warned = [f"warning: {w}" for w in recipe.warnings()]
        for line in drift + warned:
            log.warning("%s: %s", run_dir.root, line)
        with (run_dir.root / "run.log").open("a") as log_file:
            log_file.write("\n".join(project_lines + drift + recipe.header_lines() + warned) + "\n")
        observer_set = ObserverSet(run_observers(config.output, recipe.config_dump, observers))
        done = run_dir.finished(recipe.total_steps)
        if done is not None and done.step == recipe.total_steps:
            log.warning("%s", run_dir.note_complete(done, recipe.train_more))
            outcome = recipe.finished(run_dir, done)  # may refuse (SFT: the plan changed) before any event
            _emit_start(observer_set, recipe, run_dir, done.step)
            observer_set.emit(RunEnded("completed", done.step, 0.0))
            return outcome
        last = run_dir.last_checkpoint()
        if last is not None and last.step > recipe.total_steps:
            raise UserError(
                f"{run_dir.root} has a checkpoint at step {last.step}, past the {recipe.total_steps} steps this "
                f"config plans; use a new output.run_name (or {recipe.train_more})"
            )
        await recipe.prepare(run_dir)
        connection = await LoopsConnection.open(config.compute, state_dir=run_dir.state / "local_loops")
        try:
            training_client = await connection.training_client(
                config.model.base_model,
                rank=config.model.lora_rank,
                seed=recipe.seed,
                max_seq_len=config.model.max_seq_len,
            )
            run_dir.record_attempt(
                resumed,
                training_client.run_id,
                {
                    "recipe": recipe.name,
                    "model": config.model.base_model,
                    "scope": config.compute.scope,
                    "config_path": str(recipe.config_path),
                    "config": recipe.config_dump,
                    # Resolved now, so sampling or resuming this run later renders as it trained.
                    "renderer": renderer_record(config.model, resumed),
                    **recipe.run_record(),
                },
            )
            run = await recipe.start(RunStart(run_dir, training_client, observer_set, stop))
            run.sampler_counters = connection.sampler_counters
            start = await run.resume_point()
            _emit_start(observer_set, recipe, run_dir, start)
            return await run.execute(start)
        finally:
            await connection.close()
    finally:
        try:
            await recipe.close()
        finally:
            lock.release()


def _emit_start(observers: ObserverSet, recipe: Recipe, run_dir: RunDirectory, start: int) -> None:
    config = recipe.config
    observers.emit(
        RunStarted(
            run_dir=str(run_dir.root),
            config=str(recipe.config_path),  # what a resume line names
            recipe=recipe.name,
            model=config.model.base_model,
            scope=config.compute.scope,
            max_steps=recipe.total_steps,
            start_step=start,
        )
    )
