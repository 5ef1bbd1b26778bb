"""The RL recipe's config: `recipe = "rl"` with `[runtime]`, `[sampling]` and `[training]`."""

from __future__ import annotations

from typing import Any, Callable, Literal  # noqa: UP035 (typing.Callable reads better in the glossary)

from pydantic import Field, field_serializer, field_validator, model_validator

from loops_nb.config.sections import RecipeConfig, Section
from loops_nb.providers.provider_config import ProviderConfig
from loops_nb.rl.attempt_boundary import REWARD_LIMIT
from loops_nb.run.optimizer import OptimizerSettings


class RuntimeConfig(Section):
    factory: str
    """Import path `module:name` of the runtime: an Episode class, or a factory returning a
    RolloutRuntime. Modules beside the config are importable."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the runtime's factory (task files, tool settings, ...)."""

    agent_env: list[str] = Field(default_factory=list)
    """Names of environment variables that agent programs (`openai_http`) inherit from the training
    process, besides PATH, HOME, the locale and their lease; every other variable is withheld. The
    run's own credentials (BASETEN_API_KEY, HF_TOKEN, ...) cannot be named."""

    @field_validator("agent_env")
    @classmethod
    def _passable_names(cls, names: list[str]) -> list[str]:
        from loops_nb.model_access.agent_env import refused_agent_env_name

        for name in names:
            why = refused_agent_env_name(name)
            if why is not None:
                raise ValueError(f"{why}; remove it from the list")
        return names


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of rollouts (1.0 samples the policy as trained)."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""

    max_tokens: int = Field(256, ge=1)
    """Most tokens one model call may generate."""


class RLTrainingConfig(OptimizerSettings):
    max_steps: int = Field(10, ge=1)
    """Optimizer steps (policy updates) to run."""

    group_size: int = Field(8, ge=1)
    """Attempts per task; GRPO compares rewards within a group."""

    groups_per_step: int = Field(8, ge=1)
    """Task groups trained on per step."""

    max_concurrent_rollouts: int = Field(32, ge=1)
    """Most attempts running at once."""

    mode: Literal["sync", "async"] = "sync"
    """`sync`: sample, then train, then publish. `async`: keep sampling while the trainer trains."""

    max_staleness: int = Field(1, ge=0)
    """Async only: most policy versions a trained rollout may lag the trainer."""

    stale_policy: Literal["requeue", "pace"] = "pace"
    """Async only: sampling waits so no rollout gets past max_staleness (`pace`), or a rollout past it
    is re-run (`requeue`: groups are trained in the order they finish, so long-tailed agent tasks don't
    wait on stragglers, at the price of re-running stale ones). `pace` is the default: on the
    quickstart it was faster in every measurement (docs/benchmarks.md)."""

    attempt_timeout_seconds: float = Field(600.0, gt=0)
    """An attempt running longer is discarded with reason `timeout`."""

    reward_min: float = Field(-1.0, ge=-REWARD_LIMIT, le=REWARD_LIMIT)
    """Lowest reward an attempt may return; one below it is discarded as `invalid_reward`. GRPO only
    centres rewards, so their scale is the update's: widen the range only for rewards on another scale."""

    reward_max: float = Field(1.0, ge=-REWARD_LIMIT, le=REWARD_LIMIT)
    """Highest reward an attempt may return; one above it is discarded as `invalid_reward`."""

    loss: str | Callable[..., Any] = "importance_sampling"
    """Loss: `importance_sampling`, `ppo` or `cispo` (built into Loops), or `module:function` (from
    Python also the function itself) for a custom loss through forward_backward_custom (the
    `custom-loss` extra; see docs/reference/vision_and_custom_loss.md)."""

    loss_config: dict[str, float] = Field(default_factory=dict)
    """The loss's settings, e.g. clip_low_threshold and clip_high_threshold for ppo and cispo; a
    custom loss gets them as keyword arguments."""

    learning_rate: float = Field(4e-5, gt=0)
    """Adam learning rate."""

    save_every: int = Field(5, ge=0)
    """Save resumable trainer state every this many steps (0: only at the end)."""

    seed: int = 0
    """Seed of task order, sampling and the LoRA initialisation."""

    @field_serializer("loss", when_used="json")
    def _loss_name(self, loss: str | Callable[..., Any]) -> str:
        from loops_nb.rl.custom_loss import loss_name

        return loss_name(loss)

    @model_validator(mode="after")
    def _reward_range(self) -> RLTrainingConfig:
        if self.reward_min >= self.reward_max:
            raise ValueError(
                f"training.reward_min = {self.reward_min:g} must be below training.reward_max = {self.reward_max:g}"
            )
        return self

    @model_validator(mode="after")
    def _known_loss(self) -> RLTrainingConfig:
        from loops_nb.rl.custom_loss import unknown_loss_problem

        problem = unknown_loss_problem(self.loss)
        if problem is not None:
            raise ValueError(problem)
        return self


class RLEvalConfig(Section):
    enabled: bool = False
    """Evaluate the policy during the run. A config with an `[eval]` table (or an `--eval.*` override) has
    it on unless it says `enabled = false`; `loops eval` evaluates a checkpoint with these settings either
    way. Eval attempts run through the same runtime and agent as training and never train."""

    options: dict[str, Any] | None = None
    """Held-out tasks: a second instance of `runtime.factory`, built with `runtime.options` updated by these
    (another task file, another seed range), whose `tasks()` are the eval tasks. Unset: the eval tasks are
    the training runtime's own (all of them, or the `holdout` share)."""

    holdout: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of the training runtime's tasks held out for evaluation, chosen by `training.seed`: training
    never samples them (even with `enabled = false`, so turning evaluation on or off changes no training).
    0 evaluates on the training tasks themselves. Not with `options`; a resume must keep it."""

    max_tasks: int | None = Field(None, ge=1)
    """Evaluate at most this many of the eval tasks (a seeded choice; the same ones at every evaluation)."""

    attempts: int = Field(4, ge=1)
    """Attempts per eval task. pass@1 and pass@attempts are reported (`eval/pass_at_<k>`)."""

    temperature: float | None = Field(None, ge=0)
    """Sampling temperature of eval attempts: 0 is greedy; unset uses `sampling.temperature`."""

    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus sampling threshold of eval attempts; unset uses `sampling.top_p`."""

    max_tokens: int | None = Field(None, ge=1)
    """Most tokens one model call of an eval attempt may generate; unset uses `sampling.max_tokens`."""

    pass_threshold: float = 1.0
    """An attempt passes (for pass@k) when its reward is at least this; a discarded attempt never passes."""

    every: int = Field(0, ge=0)
    """Evaluate every this many steps (before the step samples, so `eval/*` in a step's record measures
    the policy that step's rollouts sampled); 0: only at the start and the end."""

    at_start: bool = True
    """Evaluate before the first step: the base model (policy version 0)."""

    at_end: bool = True
    """Evaluate the final policy after the last step (before the final checkpoint); not when stopped."""

    seed: int = 0
    """Seed of the `max_tasks` choice and of the eval attempts' sampling (the same seeds at every
    evaluation, so two evaluations differ by the policy, not by luck)."""

    @model_validator(mode="before")
    @classmethod
    def _on_when_given(cls, data: object) -> object:
        # Writing an [eval] table is asking for evaluation; only an explicit `enabled = false` keeps it off.
        if isinstance(data, dict) and "enabled" not in data:
            return {**data, "enabled": True}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> RLEvalConfig:
        if self.options is not None and self.holdout > 0:
            raise ValueError(
                "eval.options and eval.holdout: give held-out tasks from their own runtime instance or a "
                "share of the training tasks, not both"
            )
        return self


class RLConfig(RecipeConfig):
    recipe: Literal["rl"] = "rl"
    """The recipe: `rl` trains on what an agent did, scored by a verifier."""

    runtime: RuntimeConfig
    """The runtime that runs attempts: an Episode class or a RolloutRuntime factory."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How rollouts sample from the policy."""

    training: RLTrainingConfig = Field(default_factory=RLTrainingConfig)
    """GRPO, scheduling and optimisation settings."""

    eval: RLEvalConfig = Field(default_factory=lambda: RLEvalConfig(enabled=False))
    """Evaluation on held-out (or the training) tasks: which tasks, attempts, sampling and cadence."""

    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    """Environment backends by name (`[providers.<name>]` with `type` = local, docker, blaxel or
    daytona); a runtime names the one it uses. A built-in type's name works without a table."""
