"""`HarborRuntime`: Harbor as one RolloutRuntime among others. Each attempt is one Harbor trial.

Harbor brings the environment, the instruction and the verifier; the user brings only the agent, a
`LoopsAgent` subclass named by import path (`[runtime] factory = "loops_nb.harbor:create_runtime"`, its
`[runtime.options]` in docs/reference/harbor.md). Trials run with the run's sandbox journal, so `loops
cleanup` can release what a crash left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loops_nb.errors import ConfigError, UserError
from loops_nb.harbor.evidence import evidence_from_trial
from loops_nb.llm.client import bind_llm, unbind_llm
from loops_nb.model_access import ModelAccessMode
from loops_nb.providers.adapters import ProviderAdapter, provider_adapter
from loops_nb.providers.local_verifier import read_text
from loops_nb.providers.provider_config import LocalProviderConfig
from loops_nb.runtime import AgentTimeLimit, Attempt, CheckWarning, Evidence, RolloutRuntime, RunContext, Task

if TYPE_CHECKING:
    from harbor.models.trial.config import TaskConfig

    from loops_nb.harbor.agent import LoopsAgent

# litellm (a Harbor dependency; Terminus-2 imports it) otherwise fetches its cost map from GitHub on import,
# offline or not. Every agent module is in this package, so its import runs this first.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def quiet_harbor_logging() -> None:
    """Harbor pins its loggers at DEBUG; a run prints only their warnings unless it logs at DEBUG."""
    import harbor.utils.logger  # noqa: F401 -- its import sets DEBUG: import it first, then override

    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("harbor.utils.logger").setLevel(logging.WARNING)


class HarborRuntime(RolloutRuntime):
    """Runs each attempt as a Harbor trial of `agent` in a sandbox of `provider`."""

    def __init__(
        self,
        *,
        agent: str,
        tasks: str | Sequence[str] | None = None,
        dataset: str | None = None,
        task_names: Sequence[str] | None = None,
        n_tasks: int | None = None,
        provider: str = "local",
        agent_kwargs: Mapping[str, object] | None = None,
        reward_key: str = "reward",
        keep_trials: Literal["all", "failed", "none"] = "failed",
        agent_timeout_seconds: float | None = None,
        model_access: str = "in_process",
    ) -> None:
        if (tasks is None) == (dataset is None):
            raise ConfigError(
                "runtime.options: set exactly one of `tasks` (directories) or `dataset` (a name)"
            )
        self.agent = agent
        self.task_sources = [tasks] if isinstance(tasks, str) else list(tasks or [])
        self.dataset = dataset
        self.task_names = list(task_names) if task_names else None
        self.n_tasks = n_tasks
        self.provider_name = provider
        self.agent_kwargs = dict(agent_kwargs or {})
        self.reward_key = reward_key
        self.keep_trials = keep_trials
        self.agent_timeout_seconds = agent_timeout_seconds
        self.model_access = ModelAccessMode(model_access)
        self._agent_import_path: str | None = None
        self.context: RunContext | None = None
        self._tasks: list[Task] | None = None

    # -- wiring -------------------------------------------------------------------------------
    def bind(self, context: RunContext) -> None:
        self.context = context
        with contextlib.suppress(UserError):  # a bad agent path is reported by preflight / the first trial
            self.agent_import_path()  # now, while this config's directory is first on sys.path

    @property
    def provider(self) -> ProviderAdapter:
        return provider_adapter(self.provider_name, self.context.providers if self.context else {})

    def _path(self, value: str) -> Path:
        path = Path(value).expanduser()
        if not path.is_absolute() and self.context is not None:
            path = self.context.config_dir / path
        return path.resolve()

    async def preflight(self) -> list[str]:
        """Problems `loops check` reports: the agent class, the provider's extra, tools and credentials, and
        for the local provider each task `start()` would refuse (CheckWarning lines are warnings)."""
        problems: list[str] = []
        try:
            agent_class = self._agent_class()
            try:  # an agent with a Harbor options model refuses a misspelled agent_kwargs key here
                agent_class.parse_options(self.agent_kwargs)
            except ValueError as exc:
                problems.append(f"runtime.options.agent_kwargs: {' '.join(str(exc).split())}")
        except UserError as exc:
            problems.append(str(exc))
        provider = self.provider
        problems += await asyncio.to_thread(provider.problems)
        if isinstance(provider.config, LocalProviderConfig):
            problems += await self._local_task_problems(provider.config)
        return problems

    async def _local_task_problems(self, config: LocalProviderConfig) -> list[str]:
        """What the local sandbox's `start()` would refuse, said now rather than once per attempt; and, as
        warnings, verifier scripts that need what the sandbox cannot give (they end as `verifier_error`)."""
        from harbor.models.task.config import NetworkMode
        from harbor.models.task.task import Task as HarborTask

        from loops_nb.providers.local_task_fit import static_problems
        from loops_nb.providers.local_verifier import verifier_warnings

        try:
            skills = bool(self._agent_class().capabilities.skills)
        except (UserError, AttributeError):
            skills = True  # a bad agent path is reported on its own
        found: list[str] = []
        for task in await self.tasks():
            path = task.data["harbor_task"].get("path")
            if not path:
                continue  # a registry task: its files arrive when the trial starts
            task_dir = Path(path)
            try:
                env_config = HarborTask(task_dir).config.environment
            except Exception as exc:  # Harbor's own validation of task.toml
                found.append(f"task {task.id}: task.toml: {' '.join(str(exc).split())[:300]}")
                continue
            found += await asyncio.to_thread(
                static_problems, task.id, task_dir / "environment", env_config, config.ignore_dockerfile
            )
            if env_config.skills_dir and not skills:
                found.append(
                    f"task {task.id}: it has skills (environment.skills_dir = {env_config.skills_dir!r}) and "
                    f"the agent {self.agent} does not declare capabilities.skills, so Harbor refuses each trial"
                )
            network = config.network == "host" and env_config.network_mode != NetworkMode.NO_NETWORK
            found += [
                CheckWarning(w)
                for w in await asyncio.to_thread(
                    verifier_warnings, task.id, task_dir / "tests" / "test.sh", network
                )
            ]
        return found

    async def agent_time_limits(self) -> list[AgentTimeLimit]:
        """Each local task's agent timeout (the task's own, or `agent_timeout_seconds`) and the calls the agent
        expects: `loops check` compares them with how long a call takes on the local scope."""
        from harbor.models.task.task import Task as HarborTask

        try:
            agent = self._agent_class()
        except UserError:
            return []  # reported by preflight
        calls, calls_set_by = agent.expected_calls(self.agent_kwargs)
        limits = []
        for task in await self.tasks():
            path = task.data["harbor_task"].get("path")
            try:
                harbor_task = HarborTask(Path(path)) if path else None
            except Exception:  # task.toml is reported by preflight
                harbor_task = None
            if harbor_task is None:
                continue
            if self.agent_timeout_seconds is not None:
                seconds, set_by = self.agent_timeout_seconds, "[runtime.options] agent_timeout_seconds"
            else:
                seconds, set_by = (
                    harbor_task.config.agent.timeout_sec,
                    f"[agent] timeout_sec in {path}/task.toml",
                )
            prompt = agent.first_prompt(harbor_task.instruction, self.agent_kwargs)
            limits.append(AgentTimeLimit(task.id, float(seconds), set_by, calls, calls_set_by, prompt))
        return limits

    def _agent_class(self) -> type[LoopsAgent]:
        from loops_nb.episodes import import_object
        from loops_nb.harbor.agent import LoopsAgent

        cls = import_object(self.agent, "runtime.options.agent")
        if not (isinstance(cls, type) and issubclass(cls, LoopsAgent)):
            raise ConfigError(
                f"runtime.options.agent = {self.agent!r} is not a LoopsAgent subclass "
                "(from loops_nb.harbor import LoopsAgent)"
            )
        return cls

    def agent_import_path(self) -> str:
        """The import path Harbor gets: the agent's module pinned under a name no other config shares.

        Harbor imports the agent by path when each trial starts. Two configs in one process (a notebook)
        may both have an `agent.py`; pinning this runtime's module keeps its trials on its own agent.
        """
        if self._agent_import_path is None:
            cls = self._agent_class()
            module = sys.modules[cls.__module__]
            if cls.__module__.startswith(("loops_nb.", "harbor.")):
                alias = cls.__module__
            else:
                alias = f"loops_nb_agent_{uuid.uuid4().hex[:12]}_{cls.__module__.replace('.', '_')}"
                sys.modules[alias] = module
            self._agent_import_path = f"{alias}:{cls.__qualname__}"
        return self._agent_import_path

    # -- tasks --------------------------------------------------------------------------------
    async def tasks(self) -> Sequence[Task]:
        if self._tasks is None:
            configs = await self._task_configs()
            if not configs:
                raise ConfigError("runtime.options: the Harbor task sources hold no tasks")
            self._tasks = [
                Task(id=_task_name(cfg), data={"harbor_task": cfg.model_dump(mode="json", exclude_none=True)})
                for cfg in configs
            ]
        return self._tasks

    async def _task_configs(self) -> list[TaskConfig]:
        from harbor.models.job.config import DatasetConfig
        from harbor.models.task.task import Task as HarborTask
        from harbor.models.trial.config import TaskConfig

        if self.dataset is not None:
            name, _, version = self.dataset.partition("@")
            try:
                dataset = DatasetConfig(
                    name=name, version=version or None, task_names=self.task_names, n_tasks=self.n_tasks
                )
                return await dataset.get_task_configs()
            except Exception as exc:
                raise UserError(
                    f"runtime.options.dataset = {self.dataset!r}: cannot resolve it from the Harbor registry "
                    f"({type(exc).__name__}: {str(exc)[:200]}); it needs network. Offline, download the tasks "
                    f"where there is network (`harbor download {self.dataset} -o tasks`) and point "
                    "`runtime.options.tasks` at the folder it writes"
                ) from None
        configs = []
        for source in self.task_sources:
            path = self._path(source)
            if not path.is_dir():
                raise ConfigError(f"runtime.options.tasks: {path} is not a directory")
            if (path / "task.toml").is_file():
                candidates = [path]
            else:
                candidates = sorted(p for p in path.iterdir() if (p / "task.toml").is_file())
                if not candidates:
                    raise ConfigError(
                        f"runtime.options.tasks: {path} has no task.toml, nor task directories with one"
                    )
            for candidate in candidates:
                _refuse_links_out(candidate)
                if not HarborTask.is_valid_dir(candidate):
                    raise ConfigError(
                        f"Harbor task {candidate}: needs task.toml, instruction.md, tests/test.sh and an "
                        "environment/ directory (or [environment] docker_image)"
                    )
                if self.task_names and not any(fnmatch.fnmatch(candidate.name, p) for p in self.task_names):
                    continue
                configs.append(TaskConfig(path=candidate))
        return configs[: self.n_tasks] if self.n_tasks else configs

    # -- attempts -----------------------------------------------------------------------------
    def _trials_dir(self) -> Path:
        base = self.context.state_dir.parent if self.context else Path.cwd()
        return base / "harbor_trials"

    def _journal(self) -> Path:
        if self.context is None:
            raise RuntimeError("HarborRuntime.bind(context) must be called before attempts run")
        return self.context.state_dir / "journal.jsonl"

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
        from harbor.trial.trial import Trial

        from loops_nb.harbor.agent import forget_attempt, register_attempt

        key = register_attempt(attempt)
        config = TrialConfig(
            task=TaskConfig.model_validate(attempt.task.data["harbor_task"]),
            trial_name=_trial_name(attempt),
            trials_dir=self._trials_dir(),
            agent=AgentConfig(
                import_path=self.agent_import_path(),
                kwargs={
                    "loops_attempt": key,
                    "loops_config_dir": str(self.context.config_dir) if self.context else None,
                    **self.agent_kwargs,
                },
                override_timeout_sec=self.agent_timeout_seconds,
            ),
            environment=self.provider.harbor_environment(self._journal()),
        )
        trial_dir = self._trials_dir() / config.trial_name
        kept = f"trial directory: {trial_dir}"
        if self.keep_trials != "none":  # said now: a timeout cancels this coroutine before it returns
            attempt.services.evidence_kept.append(kept)
        token = bind_llm(attempt.services.llm)
        try:
            trial = await Trial.create(config)
            result = await trial.run()
        except BaseException:
            if self.keep_trials == "none":
                shutil.rmtree(trial_dir, ignore_errors=True)
            raise
        finally:
            unbind_llm(token)
            forget_attempt(key)
        evidence = evidence_from_trial(
            result, self.reward_key, read_text(trial_dir / "verifier" / "test-stdout.txt")
        )
        evidence.metrics.setdefault("harbor/trial", 1.0)
        if self.keep_trials == "none" or (self.keep_trials == "failed" and evidence.discarded is None):
            await asyncio.to_thread(shutil.rmtree, trial_dir, True)
            if kept in attempt.services.evidence_kept:
                attempt.services.evidence_kept.remove(kept)
        return evidence


def _refuse_links_out(task_dir: Path) -> None:
    """A task's files are copied into sandboxes (remote ones too): none may point outside the task."""
    root = task_dir.resolve()
    for path in task_dir.rglob("*"):
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root):
                raise ConfigError(
                    f"Harbor task {task_dir}: {path.relative_to(task_dir)} links outside the task (to {target}); "
                    "a task's files are uploaded into sandboxes, so copy the file into the task instead"
                )


def _task_name(config: TaskConfig) -> str:
    if config.path is not None and config.name is None:
        return Path(config.path).name
    return str(config.name or config.path)


def _trial_name(attempt: Attempt) -> str:
    # Harbor names trial directories after this; keep it unique per attempt and filesystem-safe.
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in attempt.task.id)[:40]
    return f"{safe}__v{attempt.policy_version}g{attempt.group}a{attempt.index}-{uuid.uuid4().hex[:6]}"


def create_runtime(**options: Any) -> HarborRuntime:
    """`[runtime] factory = "loops_nb.harbor:create_runtime"`: `[runtime.options]` are its keywords."""
    try:
        import harbor  # noqa: F401
    except ImportError:
        raise UserError("the Harbor runtime needs the harbor extra: `uv sync --extra harbor`") from None
    quiet_harbor_logging()
    return HarborRuntime(**options)
