"""The SFT recipe's composition root: `check` and `train`, wiring config, data, Loops and the run.

`loops check` / `project.check()` render every row and plan the run without starting a trainer;
`loops run` / `project.train()` train it (resuming the run directory when it exists). The data is read and
planned before Loops is reached, so a data problem never costs a trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.compute import LoopsConnection, require_api_key
from loops_nb.config_drift import resume_drift
from loops_nb.errors import DataError, UserError
from loops_nb.local.memory_budget import check_lines
from loops_nb.mirrors import run_observers
from loops_nb.observers import ObserverSet
from loops_nb.resources import RunLock
from loops_nb.run_dir import RunDirectory
from loops_nb.sft.batching import SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.refusal_file import RefusalFile
from loops_nb.sft.report import CheckReport, refusal_lines
from loops_nb.sft.schedule import describe_schedule
from loops_nb.sft.train import SFTOutcome, SFTRun
from loops_nb.tokenization import load_model_tokenizer

if TYPE_CHECKING:
    from loops_nb.project import Project

log = logging.getLogger(__name__)


@dataclass
class SFTCheckReport:
    """What `check` found: header lines, the training data's `CheckReport`, the plan, and problems.

    ``ok`` is False only when the data cannot train at all (a data file is missing, or no row trains); refused
    rows are reported, not fatal. ``warnings`` (held-out data that yields no example) do not fail the check, but
    its last line says there are some.
    """

    ok: bool = True
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: CheckReport | None = None
    plan_lines: list[str] = field(default_factory=list)
    total_steps: int | None = None
    refusals_file: str | None = None
    """Where `check(refusals=...)` wrote every refusal (None when not asked to)."""

    def describe(self) -> list[str]:
        out = list(self.lines)
        if self.data is not None:
            out += self.data.describe(refusals_written=self.refusals_file)
        out += self.plan_lines
        out += [f"note: {n}" for n in self.notes]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"problem: {p}" for p in self.problems]
        if not self.ok:
            out.append(f"check: {len(self.problems)} problem(s)")
        elif self.warnings:
            out.append(f"check: ok with {len(self.warnings)} warning(s)")
        else:
            out.append("check: ok")
        return out


def _template_name(config: SFTConfig) -> str:
    if config.model.chat_template:
        return f"built-in {config.model.chat_template!r}"
    if config.model.chat_template_file:
        return f"from {config.model.chat_template_file}"
    return "the tokenizer's own"


async def _tokenizer(config: SFTConfig) -> Any:
    return await asyncio.to_thread(
        load_model_tokenizer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
    )


def held_out_warning(config: SFTConfig, data: SFTData) -> str | None:
    """Why no held-out loss will be measured although held-out data is configured, naming the data and the first
    reasons (None when there is held-out data to evaluate, or none was asked for)."""
    held = data.held_out
    if held.index is None or held.examples:
        return None
    where = str(held.path) if config.data.eval is not None else held.source
    why = "; ".join(f"row {n}: {reason}" for n, reason in held.refusals[:2])
    more = f" ({held.refused - 2:,} more refused)" if held.refused > 2 else ""
    if held.rows:
        return (
            f"the held-out data ({where}) yields no example: all {held.rows:,} rows are refused, so no held-out "
            f"loss will be measured; first reasons: {why}{more}"
        )
    return (
        f"the held-out data ({where}) has no row, so no held-out loss will be measured; raise data.eval_fraction "
        "or set data.eval to a held-out file"
    )


def plan_lines(config: SFTConfig, data: SFTData, *, refusals_written: str | None = None) -> list[str]:
    """The held-out split, the batch plan, the schedule and the save/eval cadence, as report lines."""
    t, d, plan, held = config.training, config.data, data.plan, data.held_out
    lines = []
    if held.index is None:
        lines.append(f"held-out: {held.source}; no held-out loss is measured")
    else:
        more = " (read until the cap was reached)" if held.truncated else ""
        lines.append(
            f"held-out: {held.source}: {held.rows:,} rows{more}, {held.examples:,} examples indexed, "
            f"{held.refused:,} refused; the held-out loss uses the first {min(held.examples, data.eval_cap):,} "
            f"(training.eval_max_examples {data.eval_cap:,})"
        )
        # Held-out rows are not in the training report: list their refusals here, or a bad row that the split
        # happened to hold out would be counted but never named.
        if held.refused:
            path = str(held.path) if held.path is not None else None
            lines += refusal_lines(
                "held-out rows refused", held.refusals, held.refused, path, written=refusals_written
            )
    per_epoch = " + ".join(f"{n:,}" for n in plan.steps_per_epoch[:4]) + (" + ..." if t.epochs > 4 else "")
    capped = f"; max_steps {t.max_steps:,}" if t.max_steps is not None else ""
    lines.append(
        f"plan: {len(data.train):,} examples in batches of <= {t.batch_tokens:,} tokens, shuffled each epoch "
        f"(seed {d.shuffle_seed}): {t.epochs} epoch(s) = {per_epoch} steps{capped} -> {plan.total_steps:,} "
        f"steps ({plan.epochs_covered:.2f} epochs)"
    )
    lines.append(
        describe_schedule(
            total_steps=plan.total_steps,
            peak=t.learning_rate,
            schedule=t.lr_schedule,
            warmup_steps=t.warmup_steps,
        )
    )
    every = f"every {t.eval_every} steps, " if t.eval_every else ""
    save = f"every {t.save_every} steps and " if t.save_every else ""
    lines.append(
        f"held-out loss: before step 1, {every}and at the end; trainer state saved {save}at the end "
        f"(then the sampler weights)"
    )
    return lines


async def check(project: Project, *, refusals: str | Path | None = None, **_: Any) -> SFTCheckReport:
    """Render every row with the configured tokenizer, template and max_seq_len, and plan the run.

    ``refusals``: a file to write every refused row to, as JSONL (`RefusalFile`); the report lists the first ones.
    """
    config: SFTConfig = project.config  # type: ignore[assignment]
    report = SFTCheckReport()
    m = config.model
    report.lines.append(
        f"recipe: sft, scope {config.compute.scope}, model {m.base_model}, LoRA rank {m.lora_rank}"
    )
    if config.compute.scope != "local":
        try:
            require_api_key(config.compute.scope)
        except UserError as exc:
            report.problems.append(str(exc))
    try:
        tokenizer = await _tokenizer(config)
        with contextlib.ExitStack() as stack:
            sink = stack.enter_context(RefusalFile(refusals)) if refusals is not None else None
            data = await asyncio.to_thread(
                SFTData.load,
                config,
                tokenizer,
                config_path=project.path,
                on_refusal=sink.write if sink is not None else None,
            )
    except UserError as exc:
        report.problems.append(str(exc))
        report.ok = False
        return report
    if sink is not None:
        report.refusals_file = str(sink.path)
        report.notes.append(f"{sink.count:,} refused row(s) written to {sink.path}")
    report.lines.append(
        f"tokenizer: {len(tokenizer):,} tokens; chat template {_template_name(config)}; stop tokens "
        f"{', '.join(data.renderer.stop_tokens)}; max_seq_len {m.max_seq_len:,}"
    )
    limit = f" (data.max_rows {config.data.max_rows:,})" if config.data.max_rows else ""
    report.lines.append(f"train: {config.data.train}{limit}")
    report.data = data.report
    report.plan_lines = plan_lines(config, data, refusals_written=report.refusals_file)
    report.total_steps = data.plan.total_steps
    warning = held_out_warning(config, data)
    if warning:
        report.warnings.append(warning)
    if not len(data.train):
        report.problems.append(f"no row of {config.data.train} trains (see the refusals above)")
    lines, warnings = await asyncio.to_thread(check_lines, config.compute, m, concurrent_sequences=0)
    report.lines += lines
    report.warnings += warnings
    report.ok = not report.problems
    return report


def _data_summary(data: SFTData) -> dict[str, Any]:
    r = data.report
    return {
        "rows_read": r.rows_read,
        "rows_refused": r.rows_refused,
        "examples": len(data.train),
        "tokens": data.train.total_tokens,
        "trained_tokens": data.train.total_trained,
        "held_out": data.held_out.source,
        "held_out_rows": data.held_out.rows,
        "eval_examples": min(data.held_out.examples, data.eval_cap),
        "steps_per_epoch": data.plan.steps_per_epoch,
        "total_steps": data.plan.total_steps,
    }


async def train(
    project: Project, *, observers: list[Any] | None = None, stop: asyncio.Event | None = None
) -> SFTOutcome:
    """Train (or resume) the run; returns its `SFTOutcome`."""
    config: SFTConfig = project.config  # type: ignore[assignment]
    tokenizer = await _tokenizer(config)
    data = await asyncio.to_thread(SFTData.load, config, tokenizer, config_path=project.path)
    if not len(data.train):
        raise DataError(f"no row of {config.data.train} trains: run `loops check {project.path}` to see why")
    run_dir = RunDirectory.create(config.output.output_dir, config.output.run_name, project.path.stem)
    resumed = run_dir.read_run_json()
    drift = resume_drift("sft", resumed, json.loads(config.model_dump_json()), str(run_dir.root))
    lock = RunLock.claim(run_dir.root)
    try:
        warning = held_out_warning(config, data)
        warned = [f"warning: {warning}"] if warning else []
        for line in drift + warned:
            log.warning("%s: %s", run_dir.root, line)
        with (run_dir.root / "run.log").open("a") as log_file:
            log_file.write("\n".join(project.describe() + drift + plan_lines(config, data) + warned) + "\n")
        observer_set = ObserverSet(
            run_observers(config.output, json.loads(config.model_dump_json()), observers)
        )

        def started(start: int) -> None:
            observer_set.emit(
                "on_start",
                {
                    "run_dir": str(run_dir.root),
                    "recipe": "sft",
                    "model": config.model.base_model,
                    "scope": config.compute.scope,
                    "max_steps": data.plan.total_steps,
                    "start_step": start,
                },
            )

        done = run_dir.finished(data.plan.total_steps)
        if done is not None and done.step == data.plan.total_steps:
            # A rerun of a finished run: answered from its files, without a Loops client (which on a dedicated
            # scope could provision billable capacity for nothing) and without touching run.json.
            log.warning("%s", run_dir.note_complete(done, "raise training.max_steps or epochs to train on"))
            started(done.step)
            return SFTRun(config, run_dir, None, data, observer_set).finished(done)
        connection = await LoopsConnection.open(config.compute, state_dir=run_dir.state / "local_loops")
        try:
            tc = await connection.training_client(
                config.model.base_model,
                rank=config.model.lora_rank,
                seed=config.training.seed,
                max_seq_len=config.model.max_seq_len,
            )
            run_dir.record_attempt(
                resumed,
                tc.run_id,
                {
                    "recipe": "sft",
                    "model": config.model.base_model,
                    "scope": config.compute.scope,
                    "config_path": str(project.path),
                    "config": json.loads(config.model_dump_json()),
                    "data": _data_summary(data),
                },
            )
            run = SFTRun(config, run_dir, tc, data, observer_set, stop=stop)
            start = await run.resume_point()
            started(start)
            return await run.execute(start)
        finally:
            await connection.close()
    finally:
        lock.release()
