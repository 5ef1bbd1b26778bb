"""`loops eval CONFIG [--checkpoint base|latest|<name>]`: only the evaluation of an RL config, on a checkpoint.

The library call is `await project.evaluate(checkpoint=...)` (awaitable in a notebook's loop). It runs the
config's `[eval]` (tasks, attempts, sampling) once, with the same runtime and agent as training, against:

- `base`: the base model (no adapter);
- `latest`: the run's last checkpoint (`output.run_name`'s checkpoints.jsonl);
- a checkpoint by name (`final-000008`, `state-000004`), by step (`8`: its sampler weights over its trainer
  state) or by its path.

The checkpoint becomes a sampling client by the one path `loops_nb.run_checkpoints` gives every caller: saved
sampler weights by their path, a periodic checkpoint (trainer state only) loaded with its optimizer into a fresh
training client and published at its own step. On the local scope the embedded Loops opens the run's own state
directory, so it finds them. Nothing trains.
The results go to their own directory (`<run>/evals/<checkpoint>-<time>/`, or `out`): `evals.jsonl`,
`eval_attempts.jsonl`, `transcripts/` and `summary.json`; the run's own logs are not touched.
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
from loops_nb.model_renderer import load_model_renderer, run_renderer_choice
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
                out.append(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
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
    # The checkpoint it names (see the module's docstring); None: the base model.
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
            # The run's recorded renderer (while the config's setting is the one it recorded), as it trained.
            recorded = run_dir.read_run_json() if run_dir is not None else None
            renderer = await asyncio.to_thread(
                load_model_renderer,
                config.model,
                config.compute.scope,
                cache_dir=config.compute.local.cache_dir,
                choice=run_renderer_choice(config.model, recorded),
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
                policy=FixedPolicy(client, step),
                renderer=renderer,
                resources=resources,
            )
            evaluation = await evaluator.evaluate(step)
        finally:
            # The evaluation is what the user asked for: a runtime that fails to close does not lose it.
            with contextlib.suppress(Exception):
                await runtimes.aclose()
            if connection is not None:
                await connection.close()
        line = EvalLog(out).write(evaluation).to_json()
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
                **line,
            },
        )
        return EvalReport(
            label,
            step,
            evaluation.metrics,
            str(out),
            str(run_dir.root) if run_dir is not None else None,
            lines,
        )
    finally:
        if lock is not None:
            lock.release()
