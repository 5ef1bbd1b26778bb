"""The RL recipe's composition root: `check` and `train`, wiring config, Loops, runtime and run.

`loops check` / `project.check()` and `loops run` / `project.train()` call these.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.compute import require_api_key
from loops_nb.episodes import load_runtime
from loops_nb.errors import UserError
from loops_nb.local.memory_budget import check_lines
from loops_nb.model_access import LeasedRuntime, ModelGateway, files_per_attempt
from loops_nb.observers import ObserverSet
from loops_nb.resources import ResourceJournal, ResourceRegistry
from loops_nb.rl.config import RLConfig
from loops_nb.rl.custom_loss import TrainingLoss, loss_name, needs_reference_logprobs, resolve_custom_loss
from loops_nb.rl.evaluation import EvalLog, describe_eval, eval_tasks, held_out_options
from loops_nb.rl.loop import RLRun
from loops_nb.rl.outcome import RLOutcome
from loops_nb.rl.policy import Policy
from loops_nb.run.outcome import Outcome
from loops_nb.run.recipe_run import RecipeRun
from loops_nb.run.setup import Recipe, run_recipe
from loops_nb.run_dir import Checkpoint, RunDirectory, atomic_write_json
from loops_nb.runtime import CheckWarning, ModelAccessMode, RolloutRuntime, RunContext
from loops_nb.tokenization import load_model_renderer

if TYPE_CHECKING:
    from baseten.loops import TrainingClient

    from loops_nb.project import Project

FILES_PER_ATTEMPT = 4
"""Sockets and files one live in-process attempt may hold (sampler connection, transcript, spare)."""
FILES_BASELINE = 256
"""Open files the process needs besides attempts (torch, the servers, logs)."""

log = logging.getLogger(__name__)


def files_needed(max_concurrent: int, per_attempt: int = FILES_PER_ATTEMPT) -> int:
    return FILES_BASELINE + max_concurrent * per_attempt


def open_file_problem(max_concurrent: int, per_attempt: int = FILES_PER_ATTEMPT) -> str | None:
    """A message when the open-file limit is too low for the configured concurrency."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = files_needed(max_concurrent, per_attempt)
    if soft != resource.RLIM_INFINITY and soft < need:
        raise_to = need if hard == resource.RLIM_INFINITY else min(need, hard)
        return (
            f"open-file limit {soft} is too low for training.max_concurrent_rollouts = {max_concurrent} "
            f"(needs about {need}): run `ulimit -n {raise_to}` in this shell first"
            + (
                ""
                if hard == resource.RLIM_INFINITY or hard >= need
                else f", or lower the concurrency (hard limit {hard})"
            )
        )
    return None


def run_context(
    config: RLConfig,
    config_path: Path,
    state_dir: Path,
    resources: ResourceRegistry,
    *,
    checking: bool = False,
) -> RunContext:
    """What `RolloutRuntime.bind` gives a runtime: the config directory, providers, state and registry."""
    return RunContext(
        config_dir=config_path.parent,
        state_dir=state_dir,
        providers=config.providers,
        resources=resources,
        checking=checking,
    )


@dataclass
class RLCheckReport:
    ok: bool = True
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Settings that are valid but cannot train (a group of one); they do not fail the check."""
    preflight_dir: str | None = None
    tasks: int = 0

    def describe(self) -> list[str]:
        out = list(self.lines)
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"problem: {p}" for p in self.problems]
        if not self.ok:
            out.append(f"check: {len(self.problems)} problem(s)")
        else:  # as the SFT check says it: a warning does not fail the check, but the last line shows it
            out.append(f"check: ok with {len(self.warnings)} warning(s)" if self.warnings else "check: ok")
        return out


async def check(project: Project, **_: Any) -> RLCheckReport:
    config = project.config_as(RLConfig)
    report = RLCheckReport()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    preflight = RunDirectory(config.output.output_dir / "preflight" / stamp)
    report.preflight_dir = str(preflight.root)
    preflight.state.mkdir(parents=True, exist_ok=True)
    journal = ResourceJournal.at(preflight.state / "journal.jsonl")  # exists before any resource could
    report.lines.append(f"recipe: rl, scope {config.compute.scope}, model {config.model.base_model}")
    report.lines.append(f"preflight: {preflight.root}")

    if config.compute.scope != "local":
        try:
            require_api_key(config.compute.scope)
        except UserError as exc:
            report.problems.append(str(exc))
    try:
        renderer = await asyncio.to_thread(
            load_model_renderer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
        )
        tokenizer = renderer.tokenizer
        sample = renderer.prompt_tokens([{"role": "user", "content": "hello"}])
        report.lines.append(
            f"tokenizer: {len(tokenizer)} tokens, chat template renders a 1-message prompt in {len(sample)} tokens; "
            f"stop tokens {renderer.stop_token_ids}"
        )
    except UserError as exc:
        report.problems.append(str(exc))
        renderer = None
    access = ModelAccessMode.IN_PROCESS
    try:
        runtime = load_runtime(config.runtime.factory, config.runtime.options)
        access = runtime.model_access
        runtime.bind(
            run_context(config, project.path, preflight.state, ResourceRegistry(journal), checking=True)
        )
        found = await runtime.preflight()
        report.problems += [p for p in found if not isinstance(p, CheckWarning)]
        report.warnings += [p for p in found if isinstance(p, CheckWarning)]
        tasks = await runtime.tasks()
        report.tasks = len(tasks)
        report.lines.append(
            f"runtime: {config.runtime.factory} with {len(tasks)} task(s), model access {access.value}"
        )
        if config.eval.enabled or config.eval.holdout:
            line, warnings = await _check_eval(config, project.path, runtime, preflight, journal)
            report.lines.append(line)
            report.warnings += warnings
        # A runtime that can show its first prompts (`prompt_messages(task)`) gets them rendered here: token
        # counts, and for a vision model each prompt's images and their token cost.
        prompts = [(t.id, messages) for t in tasks if (messages := runtime.prompt_messages(t)) is not None]
        if prompts and renderer is not None:
            from loops_nb.llm.vision import describe_prompts

            report.lines += describe_prompts(renderer, prompts)
        await runtime.close()
    except UserError as exc:
        report.problems.append(str(exc))
    except Exception as exc:  # the runtime's own code (tasks(), bind, preflight): one line, no traceback
        log.info("runtime %s failed in check", config.runtime.factory, exc_info=exc)
        report.problems.append(
            f"runtime.factory = {config.runtime.factory!r} raised {type(exc).__name__}: {exc}"
        )
    t = config.training
    report.warnings += cannot_train(config)
    per_step = t.group_size * t.groups_per_step
    report.lines.append(
        f"schedule: {t.max_steps} steps x {t.groups_per_step} groups x {t.group_size} attempts = "
        f"{per_step} attempts a step, {t.mode}"
        + (f" (max_staleness {t.max_staleness}, {t.stale_policy})" if t.mode == "async" else "")
    )
    try:
        custom = resolve_custom_loss(t.loss, t.loss_config)
        if custom is not None:
            reference = (
                " (scores ref_logprobs with the version-0 policy)" if needs_reference_logprobs(custom) else ""
            )
            report.lines.append(
                f"loss: custom {loss_name(t.loss)} through forward_backward_custom{reference}"
            )
    except UserError as exc:
        report.problems.append(str(exc))
    problem = open_file_problem(t.max_concurrent_rollouts, files_per_attempt(access))
    if problem:
        report.problems.append(problem)
    lines, warnings = await asyncio.to_thread(
        check_lines, config.compute, config.model, concurrent_sequences=t.max_concurrent_rollouts
    )
    report.lines += lines
    report.warnings += warnings
    report.ok = not report.problems
    atomic_write_json(
        preflight.root / "check.json", {"ok": report.ok, "lines": report.lines, "problems": report.problems}
    )
    return report


async def _check_eval(
    config: RLConfig,
    config_path: Path,
    runtime: RolloutRuntime,
    preflight: RunDirectory,
    journal: ResourceJournal,
) -> tuple[str, list[str]]:
    """The eval tasks as the run would pick them (a held-out runtime instance built and bound as in a run)."""
    held_out = None
    if config.eval.options is not None:
        held_out = load_runtime(config.runtime.factory, held_out_options(config))
        held_out.bind(
            run_context(config, config_path, preflight.state, ResourceRegistry(journal), checking=True)
        )
    try:
        training, tasks = await eval_tasks(config, runtime, held_out)
    finally:
        if held_out is not None:
            await held_out.close()
    return describe_eval(config, len(training), len(tasks))


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

    def __init__(
        self,
        config: RLConfig,
        config_path: Path,
        runtime: RolloutRuntime,
        loss: TrainingLoss,
        eval_runtime: RolloutRuntime | None = None,
    ) -> None:
        super().__init__(config, config_path, seed=config.training.seed)
        self.rl = config
        self.runtime = runtime
        self.eval_runtime = eval_runtime
        """The `eval.options` instance of the runtime, whose tasks are the held-out ones (None: no such)."""
        self.loss = loss
        self.gateway: ModelGateway | None = None
        self.resources: ResourceRegistry | None = None

    @property
    def total_steps(self) -> int:
        return self.rl.training.max_steps

    async def prepare(self, run_dir: RunDirectory) -> None:
        # The journal exists before the runtime can create anything; `loops cleanup` reads it after a crash.
        self.resources = ResourceRegistry(ResourceJournal.at(run_dir.state / "journal.jsonl"))
        self.runtime.bind(run_context(self.rl, self.config_path, run_dir.state, self.resources))
        if self.eval_runtime is not None:
            self.eval_runtime.bind(run_context(self.rl, self.config_path, run_dir.state, self.resources))

    async def start(
        self,
        run_dir: RunDirectory,
        training_client: TrainingClient,
        observers: ObserverSet,
        stop: asyncio.Event | None,
    ) -> RecipeRun:
        config = self.rl
        if self.runtime.model_access is ModelAccessMode.OPENAI_HTTP:
            # The agent is its own program: it reaches the policy over OpenAI-compatible HTTP with a
            # per-attempt lease, through the same LoopsLLM (and exact capture) as in-process agents.
            self.gateway = await ModelGateway(model_name=config.model.base_model).astart()
            self.runtime = LeasedRuntime(self.runtime, self.gateway, agent_env=config.runtime.agent_env)
            if self.eval_runtime is not None:
                self.eval_runtime = LeasedRuntime(
                    self.eval_runtime, self.gateway, agent_env=config.runtime.agent_env
                )
        renderer = await asyncio.to_thread(
            load_model_renderer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
        )
        policy = Policy(training_client, config.model.base_model)
        return RLRun(
            config,
            run_dir,
            policy,
            self.runtime,
            renderer,
            observers,
            stop=stop,
            resources=self.resources,
            loss=self.loss,
            eval_runtime=self.eval_runtime,
        )

    def finished(self, run_dir: RunDirectory, checkpoint: Checkpoint) -> Outcome:
        outcome = super().finished(run_dir, checkpoint)
        return RLOutcome(**vars(outcome), **RLOutcome.eval_fields(EvalLog(run_dir.root).records()))

    async def close(self) -> None:
        try:
            await self.runtime.close()
            if self.eval_runtime is not None:
                await self.eval_runtime.close()
        finally:
            if self.gateway is not None:
                await self.gateway.astop()


async def train(
    project: Project, *, observers: list[Any] | None = None, stop: asyncio.Event | None = None
) -> Outcome:
    """Train (or resume) the run; returns its `Outcome`."""
    config = project.config_as(RLConfig)
    runtime = load_runtime(config.runtime.factory, config.runtime.options)
    problem = open_file_problem(
        config.training.max_concurrent_rollouts, files_per_attempt(runtime.model_access)
    )
    if problem:
        await runtime.close()
        raise UserError(problem)
    # A custom loss that cannot be imported is a config mistake: refuse it before the run directory exists.
    try:
        loss = TrainingLoss.of(config.training.loss, config.training.loss_config)
    except UserError:
        await runtime.close()
        raise
    eval_runtime = None
    if config.eval.enabled and config.eval.options is not None:
        try:
            eval_runtime = load_runtime(config.runtime.factory, held_out_options(config))
        except BaseException:
            await runtime.close()
            raise
    recipe = RLRecipe(config, project.path, runtime, loss, eval_runtime)
    return await run_recipe(recipe, project.describe(), observers=observers, stop=stop)


async def evaluate(project: Project, *, checkpoint: str = "latest", out: Path | None = None) -> Any:
    """`loops eval`: the config's `[eval]` against one checkpoint (`rl/eval_command.py`); nothing trains."""
    from loops_nb.rl.eval_command import evaluate as evaluate_checkpoint

    return await evaluate_checkpoint(project, checkpoint=checkpoint, out=out)
