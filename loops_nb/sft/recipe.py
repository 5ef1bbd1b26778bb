"""The SFT recipe's composition root: `check` and `train`, wiring config, data, Loops and the run.

`loops check` / `project.check()` render every row and plan the run without starting a trainer;
`loops run` / `project.train()` train it (resuming the run directory when it exists). The data is read and
planned before Loops is reached, so a data problem never costs a trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import DataError, UserError
from loops_nb.llm.renderer import CHAT_TEMPLATE, ChatRenderer
from loops_nb.llm.template_check import template_report
from loops_nb.model_renderer import load_model_tokenizer, model_renderer_choice, run_renderer_choice
from loops_nb.run.check_report import RecipeCheckReport
from loops_nb.run.setup import Recipe, RunStart, run_recipe
from loops_nb.run_dir import Checkpoint, RunDirectory, RunJson
from loops_nb.sft.batching import SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.loop import SFTRun, check_plan
from loops_nb.sft.outcome import SFTOutcome
from loops_nb.sft.report import CheckReport, RefusalFile

if TYPE_CHECKING:
    from loops_nb.llm.renderer_choice import RendererChoice
    from loops_nb.project import Project


@dataclass
class SFTCheckReport(RecipeCheckReport):
    """What `check` found, with the training data's `CheckReport` and the plan. Refused rows are reported, not
    problems: the check fails when no row trains (or a data file, the API key or the tokenizer is missing)."""

    data: CheckReport | None = None
    plan_lines: list[str] = field(default_factory=list)
    total_steps: int | None = None
    refusals_file: str | None = None
    """Where `check(refusals=...)` wrote every refusal (None when not asked to)."""

    def body(self) -> list[str]:
        out = [] if self.data is None else self.data.describe(refusals_written=self.refusals_file)
        return out + self.plan_lines


def _renderer_line(config: SFTConfig) -> str:
    """Which renderer SFT trains through (the one RL and sampling render with), and why."""
    choice = model_renderer_choice(config.model)
    if choice.name == CHAT_TEMPLATE:
        return f"renderer: chat_template ({choice.why}); SFT trains on the chat template's target rule"
    return (
        f"renderer: {choice.name} ({choice.why}); SFT trains what follows the family's generation prompt, "
        "through its stop token"
    )


async def _tokenizer(config: SFTConfig) -> Any:
    return await asyncio.to_thread(
        load_model_tokenizer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
    )


def held_out_warnings(config: SFTConfig, data: SFTData) -> list[str]:
    """Why no held-out loss will be measured although held-out data is configured, naming the data and the first
    reasons (none when there is held-out data to evaluate, or none was asked for)."""
    held, report = data.held_out, data.held_out.report
    if held.index is None or held.examples:
        return []
    where = report.source if config.data.eval is not None else held.source
    why = "; ".join(f"row {n}: {reason}" for n, reason in report.refusals[:2])
    more = f" ({report.rows_refused - 2:,} more refused)" if report.rows_refused > 2 else ""
    if report.rows_read:
        return [
            f"the held-out data ({where}) yields no example: all {report.rows_read:,} rows are refused, so no held-out "
            f"loss will be measured; first reasons: {why}{more}"
        ]
    return [
        f"the held-out data ({where}) has no row, so no held-out loss will be measured; raise data.eval_fraction "
        "or set data.eval to a held-out file"
    ]


def plan_lines(config: SFTConfig, data: SFTData, *, refusals_written: str | None = None) -> list[str]:
    """The held-out split, the batch plan, the schedule and the save/eval cadence, as report lines."""
    t, d, plan, held = config.training, config.data, data.plan, data.held_out
    lines = []
    if held.index is None:
        lines.append(f"held-out: {held.source}; no held-out loss is measured")
    else:
        r = held.report
        more = " (read until the cap was reached)" if held.truncated else ""
        lines.append(
            f"held-out: {held.source}: {r.rows_read:,} rows{more}, {held.examples:,} examples indexed, "
            f"{r.rows_refused:,} refused; the held-out loss uses the first {min(held.examples, data.eval_cap):,} "
            f"(training.eval_max_examples {data.eval_cap:,})"
        )
        # Held-out rows are not in the training report: list their refusals here, or a bad row that the split
        # happened to hold out would be counted but never named.
        if r.rows_refused:
            lines += r.refusal_lines("held-out rows refused", written=refusals_written)
    per_epoch = " + ".join(f"{n:,}" for n in plan.steps_per_epoch[:4]) + (" + ..." if t.epochs > 4 else "")
    capped = f"; max_steps {t.max_steps:,}" if t.max_steps is not None else ""
    lines.append(
        f"plan: {len(data.train):,} examples in batches of <= {t.batch_tokens:,} tokens, shuffled each epoch "
        f"(seed {d.shuffle_seed}): {t.epochs} epoch(s) = {per_epoch} steps{capped} -> {plan.total_steps:,} "
        f"steps ({plan.epochs_covered:.2f} epochs)"
    )
    lines.append(t.describe_schedule(plan.total_steps))
    every = f"every {t.eval_every} steps, " if t.eval_every else ""
    save = f"every {t.save_every} steps and " if t.save_every else ""
    lines.append(
        f"held-out loss: before step 1, {every}and at the end; trainer state saved {save}at the end "
        f"(then the sampler weights)"
    )
    return lines


async def check(project: Project, *, refusals: str | Path | None = None, **_: object) -> SFTCheckReport:
    """Render every row with the configured tokenizer, template and max_seq_len, and plan the run.

    ``refusals``: a file to write every refused row to, as JSONL (`RefusalFile`); the report lists the first ones.
    """
    config = project.config_as(SFTConfig)
    report = SFTCheckReport()
    m = config.model
    report.lines.append(
        f"recipe: sft, scope {config.compute.scope}, model {m.base_model}, LoRA rank {m.lora_rank}"
    )
    report.check_api_key(config.compute)
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
        return report
    if sink is not None:
        report.refusals_file = str(sink.path)
        report.notes.append(f"{sink.count:,} refused row(s) written to {sink.path}")
    renderer = data.targets.renderer
    template = (
        f"built-in {m.chat_template!r}"
        if m.chat_template
        else (f"from {m.chat_template_file}" if m.chat_template_file else "the tokenizer's own")
    )
    rendered_by = (
        f"chat template {template}" if isinstance(renderer, ChatRenderer) else "the family's renderer"
    )
    report.lines.append(
        f"tokenizer: {len(tokenizer):,} tokens; {rendered_by}; stop tokens "
        f"{', '.join(data.targets.stop_tokens)}; max_seq_len {m.max_seq_len:,}"
    )
    report.lines.append(_renderer_line(config))
    # The preflight plays a tool conversation through the renderer SFT trains through.
    line, warnings = await asyncio.to_thread(template_report, renderer)
    report.lines.append(line)
    report.warnings += warnings
    limit = f" (data.max_rows {config.data.max_rows:,})" if config.data.max_rows else ""
    report.lines.append(f"train: {config.data.train}{limit}")
    report.data = data.report
    report.plan_lines = plan_lines(config, data, refusals_written=report.refusals_file)
    report.total_steps = data.plan.total_steps
    report.warnings += held_out_warnings(config, data)
    if not len(data.train):
        report.problems.append(f"no row of {config.data.train} trains (see the refusals above)")
    await report.check_memory(config.compute, m, concurrent_sequences=0)
    return report


class SFTRecipe(Recipe):
    """The SFT recipe for the run skeleton: planned batches of rendered conversations."""

    name = "sft"
    train_more = "raise training.max_steps or epochs"

    def __init__(self, config: SFTConfig, config_path: Path, data: SFTData) -> None:
        super().__init__(config, config_path, seed=config.training.seed)
        self.sft = config
        self.data = data

    @property
    def total_steps(self) -> int:
        return self.data.plan.total_steps

    def header_lines(self) -> list[str]:
        return plan_lines(self.sft, self.data)

    def warnings(self) -> list[str]:
        return held_out_warnings(self.sft, self.data)

    def run_record(self) -> RunJson:
        data, report = self.data, self.data.report
        summary = {
            "rows_read": report.rows_read,
            "rows_refused": report.rows_refused,
            "examples": len(data.train),
            "tokens": sum(data.train.tokens),
            "trained_tokens": sum(data.train.trained),
            "held_out": data.held_out.source,
            "held_out_rows": data.held_out.report.rows_read,
            "eval_examples": min(data.held_out.examples, data.eval_cap),
            "steps_per_epoch": data.plan.steps_per_epoch,
            "total_steps": data.plan.total_steps,
        }
        return {"data": summary}

    def finished(self, run_dir: RunDirectory, checkpoint: Checkpoint) -> SFTOutcome:
        # Its steps must still be the plan's, as on a resume: a changed plan is refused, not reported as this run.
        check_plan(run_dir, self.data.plan)
        return SFTOutcome.of(run_dir, checkpoint)

    async def start(self, run: RunStart) -> SFTRun:
        return SFTRun(self.sft, run.run_dir, run.training_client, self.data, run.observers, stop=run.stop)


def _resumed_renderer(config: SFTConfig) -> RendererChoice | None:
    """The renderer a run being resumed recorded in its run.json (a newer `renderers` never re-renders a
    half-trained run's data with another renderer); None for a new run."""
    if not config.output.run_name:
        return None
    path = config.output.output_dir / config.output.run_name / "run.json"  # read only: no run dir made here
    try:
        run_json = json.loads(path.read_text())
    except (OSError, ValueError):  # no run yet (or an unreadable one, which the run's setup reports)
        return None
    return run_renderer_choice(config.model, run_json)


async def train(
    project: Project, *, observers: list[Any] | None = None, stop: asyncio.Event | None = None
) -> SFTOutcome:
    """Train (or resume) the run; returns its `SFTOutcome`. The data is read and planned before anything else,
    so a data problem never costs a run directory or a trainer."""
    config = project.config_as(SFTConfig)
    tokenizer = await _tokenizer(config)
    data = await asyncio.to_thread(
        SFTData.load, config, tokenizer, config_path=project.path, renderer_choice=_resumed_renderer(config)
    )
    if not len(data.train):
        raise DataError(f"no row of {config.data.train} trains: run `loops check {project.path}` to see why")
    outcome = await run_recipe(
        SFTRecipe(config, project.path, data), project.describe(), observers=observers, stop=stop
    )
    assert isinstance(outcome, SFTOutcome)
    return outcome
