"""`loops eval CONFIG [--checkpoint base|latest|<name>]` and `project.evaluate()`: the config's `[eval]`, once,
on one checkpoint of its run; nothing trains.

The checkpoint becomes a sampling client by the one path `loops_nb.run_checkpoints` gives every caller, and
the results go to their own directory, never the run's logs (docs/reference/training_loop.md#loops-eval).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.compute import LoopsConnection
from loops_nb.errors import UserError
from loops_nb.model_renderer import load_model_renderer
from loops_nb.observers import shown
from loops_nb.resources import ResourceJournal, ResourceRegistry, RunLock
from loops_nb.rl.config import RLConfig
from loops_nb.rl.evaluation import EvalLog, Evaluator, eval_sampling, eval_tasks
from loops_nb.rl.runtimes import RolloutRuntimes
from loops_nb.run_checkpoints import BASE, checkpoint_sampling_client, find_checkpoint
from loops_nb.run_dir import RunDirectory, atomic_write_json

if TYPE_CHECKING:
    from baseten.loops import SamplingClient

    from loops_nb.project import Project


@dataclass(frozen=True)
class FixedPolicy:
    """A policy that does not change: one checkpoint's (or the base model's) sampling client."""

    sampling_client: SamplingClient
    version: int


@dataclass
class EvalReport:
    """What `loops eval` measured: the `eval/*` metrics of one checkpoint, and where the results are."""

    checkpoint: str
    step: int
    metrics: dict[str, Any]
    output_dir: str
    run_dir: str | None = None
    lines: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        out = list(self.lines)
        out.append(f"checkpoint: {self.checkpoint} ({self.step} steps)")
        for key, value in self.metrics.items():
            if key.startswith("eval/") and not key.startswith("eval/discarded/"):
                out.append(f"{key}: {shown(value)}")
        out.append(f"results: {self.output_dir}")
        return out


async def evaluate(project: Project, *, checkpoint: str = "latest", out: Path | None = None) -> EvalReport:
    """Evaluate ``checkpoint`` of the project's run with its `[eval]` settings; nothing trains."""
    config = project.config_as(RLConfig)
    existing = (
        config.output.output_dir / config.output.run_name if config.output.run_name is not None else None
    )
    run_dir = RunDirectory(existing) if existing is not None and existing.is_dir() else None
    if run_dir is None and checkpoint != BASE:
        raise UserError(
            f"--checkpoint {checkpoint}: {existing} does not exist; no run to evaluate (or use base)"
            if existing is not None
            else f"--checkpoint {checkpoint}: set output.run_name to the run whose checkpoint to evaluate "
            "(or evaluate --checkpoint base)"
        )
    # `base`, `latest`, a name, a step or a path; None: the base model.
    target = find_checkpoint(run_dir, checkpoint) if run_dir is not None else None
    label, step = (target.name, target.step) if target is not None else (BASE, 0)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if out is None:
        parent = (
            run_dir.root if run_dir is not None else config.output.output_dir / f"{project.path.stem}-base"
        )
        out = parent / "evals" / f"{label}-{stamp}"
    state = out / "state"
    state.mkdir(parents=True, exist_ok=True)
    # A live run on this directory would share its local Loops state: refuse, as a second `loops run` is.
    lock = RunLock.claim(run_dir.root) if run_dir is not None else None
    try:
        resources = ResourceRegistry(ResourceJournal.at(state / "journal.jsonl"))
        held_out = config.eval.options is not None
        runtimes = await RolloutRuntimes.open(config, project.path, eval_only=True)
        loops_state = (run_dir.state if run_dir is not None else state) / "local_loops"
        connection: LoopsConnection | None = None
        try:
            runtimes.bind(state, resources)
            _, tasks = await eval_tasks(config, runtimes.training, runtimes.training if held_out else None)
            renderer = await asyncio.to_thread(
                load_model_renderer,
                config.model,
                config.compute.scope,
                cache_dir=config.compute.local.cache_dir,
                run_json=run_dir.read_run_json() if run_dir is not None else None,  # as the run trained
            )
            connection = await LoopsConnection.open(config.compute, state_dir=loops_state)
            client = await checkpoint_sampling_client(
                connection, config.model, target, seed=config.training.seed
            )
            await runtimes.lease_model_access()
            evaluator = Evaluator(
                config,
                runtimes.training,
                tasks,
                log=EvalLog(out),
                policy=FixedPolicy(client, step),
                renderer=renderer,
                resources=resources,
            )
            record = await evaluator.evaluate(step)
        finally:
            # The evaluation is what the user asked for: a runtime that fails to close does not lose it.
            with contextlib.suppress(Exception):
                await runtimes.aclose()
            if connection is not None:
                await connection.close()
        temperature = eval_sampling(config).temperature
        lines = [
            f"eval: {len(tasks)} task(s) x {config.eval.attempts} attempt(s), temperature {temperature:g}"
            + (" (held-out runtime options)" if held_out else "")
            + (f" (holdout {config.eval.holdout:g} of the training tasks)" if config.eval.holdout else "")
        ]
        atomic_write_json(
            out / "summary.json",
            {
                "config_path": str(project.path),
                "run_dir": str(run_dir.root) if run_dir is not None else None,
                "checkpoint": label,
                # Saved sampler weights (`bt://loops:<run>/sampler_weights/<name>`), or trainer state.
                "sampler_path": target.path if target is not None and target.kind == "sampler" else None,
                "state_path": target.path if target is not None and target.kind == "trainer" else None,
                **record.to_json(),
            },
        )
        return EvalReport(
            label,
            step,
            dict(record.metrics),
            str(out),
            str(run_dir.root) if run_dir is not None else None,
            lines,
        )
    finally:
        if lock is not None:
            lock.release()
