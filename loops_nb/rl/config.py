"""The RL recipe's config: `recipe = "rl"` with `[runtime]`, `[sampling]` and `[training]`."""

from __future__ import annotations

from typing import Any, Callable, Literal  # noqa: UP035 (typing.Callable reads better in the glossary)

from pydantic import Field, field_serializer, field_validator, model_validator

from loops_nb.config.sections import RecipeConfig, Section
from loops_nb.providers.config import ProviderConfig
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
        from loops_nb.model_access.agent_program import refused_agent_env_name

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


class RLConfig(RecipeConfig):
    recipe: Literal["rl"] = "rl"
    """The recipe: `rl` trains on what an agent did, scored by a verifier."""

    runtime: RuntimeConfig
    """The runtime that runs attempts: an Episode class or a RolloutRuntime factory."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How rollouts sample from the policy."""

    training: RLTrainingConfig = Field(default_factory=RLTrainingConfig)
    """GRPO, scheduling and optimisation settings."""

    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    """Environment backends by name (`[providers.<name>]` with `type` = local, docker, blaxel or
    daytona); a runtime names the one it uses. A built-in type's name works without a table."""
