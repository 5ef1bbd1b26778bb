"""The RL recipe's composition root: `check` and `train`, wiring config, Loops, runtime and run.

`loops check` / `project.check()` and `loops run` / `project.train()` call these. The runtimes (training's and
the held-out one) are one async context manager, `RolloutRuntimes`, so every path closes them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.llm.renderer import Renderer
from loops_nb.llm.template_check import template_report
from loops_nb.model_access import open_file_problem
from loops_nb.model_renderer import load_model_renderer, model_renderer_choice
from loops_nb.resources import ResourceJournal, ResourceRegistry
from loops_nb.rl.agent_time_check import agent_time_warnings
from loops_nb.rl.config import RLConfig
from loops_nb.rl.custom_loss import TrainingLoss, loss_name
from loops_nb.rl.eval_command import evaluate as evaluate  # `loops eval` (`project.evaluate`)
from loops_nb.rl.evaluation import describe_eval, eval_tasks
from loops_nb.rl.loop import RLRun
from loops_nb.rl.outcome import RLOutcome
from loops_nb.rl.policy import Policy
from loops_nb.rl.runtimes import RolloutRuntimes
from loops_nb.run.check_report import RecipeCheckReport
from loops_nb.run.recipe_run import RecipeRun
from loops_nb.run.run_outcome import Outcome
from loops_nb.run.setup import Recipe, RunStart, run_recipe
from loops_nb.run_dir import RunDirectory, atomic_write_json
from loops_nb.runtime import CheckWarning, ModelAccessMode

if TYPE_CHECKING:
    from loops_nb.project import Project

log = logging.getLogger(__name__)


async def check(project: Project, **_: object) -> RecipeCheckReport:
    """Resolve the config, the tokenizer and the runtime's tasks, and size the run, without a trainer."""
    config = project.config_as(RLConfig)
    report = RecipeCheckReport()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    preflight = RunDirectory(config.output.output_dir / "preflight" / stamp)
    preflight.state.mkdir(parents=True, exist_ok=True)
    journal = ResourceJournal.at(preflight.state / "journal.jsonl")  # exists before any resource could
    report.lines.append(f"recipe: rl, scope {config.compute.scope}, model {config.model.base_model}")
    report.lines.append(f"preflight: {preflight.root}")

    report.check_api_key(config.compute)
    renderer = await _check_renderer(config, report)
    access = await _check_runtime(config, project.path, preflight, journal, renderer, report)
    report.warnings += cannot_train(config)
    _check_schedule_and_loss(config, report)
    problem = open_file_problem(config.training.max_concurrent_rollouts, access)
    if problem:
        report.problems.append(problem)
    await report.check_memory(config.compute, config.model, config.training.max_concurrent_rollouts)
    atomic_write_json(
        preflight.root / "check.json", {"ok": report.ok, "lines": report.lines, "problems": report.problems}
    )
    return report


async def _check_renderer(config: RLConfig, report: RecipeCheckReport) -> Renderer | None:
    """The model's tokenizer and renderer, as training renders prompts (None when they cannot load)."""
    try:
        # Said before loading anything: which renderer, and why, is worth knowing when the tokenizer fails.
        choice = model_renderer_choice(config.model)
        report.lines.append(f"renderer: {choice.name} ({choice.why})")
        renderer = await asyncio.to_thread(
            load_model_renderer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
        )
    except UserError as exc:
        report.problems.append(str(exc))
        return None
    sample = renderer.prompt_tokens([{"role": "user", "content": "hello"}])
    report.lines.append(
        f"tokenizer: {len(renderer.tokenizer)} tokens, the renderer renders a 1-message prompt in "
        f"{len(sample)} tokens; stop tokens {renderer.stop_token_ids}"
    )
    line, warnings = await asyncio.to_thread(template_report, renderer)
    report.lines.append(line)
    report.warnings += warnings
    return renderer


async def _check_runtime(
    config: RLConfig,
    config_path: Path,
    preflight: RunDirectory,
    journal: ResourceJournal,
    renderer: Renderer | None,
    report: RecipeCheckReport,
) -> ModelAccessMode:
    """The runtime as a run would build it: its own preflight, its tasks, the eval tasks and the first prompts.
    Returns its model access (in-process when it cannot load), which sizes the open-file check."""
    access = ModelAccessMode.IN_PROCESS
    try:
        async with await RolloutRuntimes.open(config, config_path, held_out=_checks_eval(config)) as runtimes:
            access = runtimes.model_access
            runtimes.bind(preflight.state, ResourceRegistry(journal), checking=True)
            runtime = runtimes.training
            found = await runtime.preflight()
            report.problems += [p for p in found if not isinstance(p, CheckWarning)]
            report.warnings += [p for p in found if isinstance(p, CheckWarning)]
            tasks = await runtime.tasks()
            if renderer is not None:
                report.warnings += await agent_time_warnings(config, runtime, renderer)
            report.lines.append(
                f"runtime: {config.runtime.factory} with {len(tasks)} task(s), model access {access.value}"
            )
            if _checks_eval(config):
                # The eval tasks as the run would pick them, from the held-out instance when there is one.
                training, held = await eval_tasks(config, runtime, runtimes.held_out)
                line, warnings = describe_eval(config, len(training), len(held))
                report.lines.append(line)
                report.warnings += warnings
            # A runtime that can show its first prompts (`prompt_messages(task)`) gets them rendered here:
            # token counts, and for a vision model each prompt's images and their token cost.
            prompts = [(t.id, m) for t in tasks if (m := runtime.prompt_messages(t)) is not None]
            if prompts and renderer is not None:
                from loops_nb.llm.vision import describe_prompts

                report.lines += describe_prompts(renderer, prompts)
            lines, problems = await runtime.check_lines(renderer)  # e.g. the verifiers runtime's episode
            report.lines += lines
            report.problems += problems
    except UserError as exc:
        report.problems.append(str(exc))
    except Exception as exc:  # the runtime's own code (tasks(), bind, preflight): one line, no traceback
        log.info("runtime %s failed in check", config.runtime.factory, exc_info=exc)
        report.problems.append(
            f"runtime.factory = {config.runtime.factory!r} raised {type(exc).__name__}: {exc}"
        )
    return access


def _checks_eval(config: RLConfig) -> bool:
    return config.eval.enabled or bool(config.eval.holdout)


def _check_schedule_and_loss(config: RLConfig, report: RecipeCheckReport) -> None:
    """The schedule's line, and a custom loss resolved as the run would (an unimportable one is a problem)."""
    t = config.training
    per_step = t.group_size * t.groups_per_step
    report.lines.append(
        f"schedule: {t.max_steps} steps x {t.groups_per_step} groups x {t.group_size} attempts = "
        f"{per_step} attempts a step, {t.mode}"
        + (f" (max_staleness {t.max_staleness}, {t.stale_policy})" if t.mode == "async" else "")
    )
    try:
        loss = TrainingLoss.of(t.loss, t.loss_config)
    except UserError as exc:
        report.problems.append(str(exc))
        return
    if loss.custom is not None:
        reference = " (scores ref_logprobs with the version-0 policy)" if loss.needs_reference else ""
        report.lines.append(f"loss: custom {loss_name(t.loss)} through forward_backward_custom{reference}")


def cannot_train(config: RLConfig) -> list[str]:
    """Settings that validate but can never train: GRPO learns only from reward differences in a group."""
    t, found = config.training, []
    if t.group_size == 1:
        found.append(
            "training.group_size = 1: a group of one attempt has no other to compare with, so no step "
            "trains anything; use 2 or more (8 is the default)"
        )
    if config.sampling.temperature == 0:
        found.append(
            "sampling.temperature = 0: every attempt of a group samples the same completion, so groups have "
            "no reward differences to learn from unless the episode itself is random; use a temperature above 0"
        )
    return found


class RLRecipe(Recipe):
    """The RL recipe for the run skeleton: a runtime's attempts, scored and trained with GRPO."""

    name = "rl"
    outcome_type = RLOutcome

    def __init__(
        self, config: RLConfig, config_path: Path, runtimes: RolloutRuntimes, loss: TrainingLoss
    ) -> None:
        super().__init__(config, config_path, seed=config.training.seed)
        self.rl = config
        self.runtimes = runtimes
        self.loss = loss
        self.resources: ResourceRegistry | None = None

    @property
    def total_steps(self) -> int:
        return self.rl.training.max_steps

    async def prepare(self, run_dir: RunDirectory) -> None:
        # The journal exists before the runtime can create anything; `loops cleanup` reads it after a crash.
        self.resources = ResourceRegistry(ResourceJournal.at(run_dir.state / "journal.jsonl"))
        self.runtimes.bind(run_dir.state, self.resources)

    async def start(self, run: RunStart) -> RecipeRun:
        config = self.rl
        await self.runtimes.lease_model_access()
        renderer = await asyncio.to_thread(
            load_model_renderer,
            config.model,
            config.compute.scope,
            cache_dir=config.compute.local.cache_dir,
            run_json=run.run_dir.read_run_json(),
        )
        policy = Policy(run.training_client, config.model.base_model)
        return RLRun(
            config,
            run.run_dir,
            policy,
            self.runtimes.training,
            renderer,
            run.observers,
            stop=run.stop,
            resources=self.resources,
            loss=self.loss,
            eval_runtime=self.runtimes.held_out if config.eval.enabled else None,
        )

    async def close(self) -> None:
        await self.runtimes.aclose()


async def train(
    project: Project, *, observers: list[Any] | None = None, stop: asyncio.Event | None = None
) -> Outcome:
    """Train (or resume) the run; returns its `Outcome`."""
    config = project.config_as(RLConfig)
    async with await RolloutRuntimes.open(config, project.path, held_out=config.eval.enabled) as runtimes:
        problem = open_file_problem(config.training.max_concurrent_rollouts, runtimes.model_access)
        if problem:
            raise UserError(problem)
        # A custom loss that cannot be imported is a config mistake: refuse it before the run directory exists.
        loss = TrainingLoss.of(config.training.loss, config.training.loss_config)
        recipe = RLRecipe(config, project.path, runtimes, loss)
        return await run_recipe(recipe, project.describe(), observers=observers, stop=stop)
