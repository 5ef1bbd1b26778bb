"""The rollout runtimes of one RL config, opened and closed as one: an async context manager.

`loops run` (the RL recipe), `loops check` and `loops eval` all take their runtimes this way, so each is
loaded, bound, given the gateway its agents need, and closed on every path: a failure half-way closes what was
already loaded, and the gateway stops after the runtimes that lease from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from loops_nb.episodes import load_runtime
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.resources import ResourceRegistry
from loops_nb.rl.config import RLConfig
from loops_nb.rl.evaluation import held_out_options
from loops_nb.runtime import ModelAccessMode, RolloutRuntime, RunContext


@dataclass
class RolloutRuntimes:
    """The training runtime (``runtime.options``), the held-out one (``eval.options``, when asked for and set),
    and the gateway their agents reach the model through when they are their own programs."""

    config: RLConfig
    config_path: Path
    training: RolloutRuntime
    held_out: RolloutRuntime | None = None
    gateway: ModelGateway | None = None
    _closed: bool = field(default=False, init=False, repr=False)

    @classmethod
    async def open(
        cls, config: RLConfig, config_path: Path, *, held_out: bool = False, eval_only: bool = False
    ) -> Self:
        """Load the runtimes. ``held_out``: also the ``eval.options`` instance, when the config sets one.
        ``eval_only`` (`loops eval`): only the runtime evaluation runs on, the held-out one when set."""
        options = config.runtime.options
        if eval_only and config.eval.options is not None:
            options, held_out = held_out_options(config), False
        runtimes = cls(config, config_path, load_runtime(config.runtime.factory, options))
        if held_out and config.eval.options is not None:
            try:
                runtimes.held_out = load_runtime(config.runtime.factory, held_out_options(config))
            except BaseException:
                await runtimes.aclose()
                raise
        return runtimes

    @property
    def model_access(self) -> ModelAccessMode:
        return self.training.model_access

    def all(self) -> list[RolloutRuntime]:
        return [self.training] if self.held_out is None else [self.training, self.held_out]

    def bind(self, state_dir: Path, resources: ResourceRegistry, *, checking: bool = False) -> None:
        """Bind every runtime to the run's state directory and resource registry (journalled first)."""
        context = RunContext(
            config_dir=self.config_path.parent,
            state_dir=state_dir,
            providers=self.config.providers,
            resources=resources,
            checking=checking,
        )
        for runtime in self.all():
            runtime.bind(context)

    async def lease_model_access(self) -> None:
        """When the agents are their own programs, start the gateway and lease each attempt the model through
        it (the same LoopsLLM and exact capture as in-process agents); otherwise nothing."""
        if self.model_access is not ModelAccessMode.OPENAI_HTTP or self.gateway is not None:
            return
        self.gateway = await ModelGateway(model_name=self.config.model.base_model).astart()
        agent_env = self.config.runtime.agent_env
        self.training = LeasedRuntime(self.training, self.gateway, agent_env=agent_env)
        if self.held_out is not None:
            self.held_out = LeasedRuntime(self.held_out, self.gateway, agent_env=agent_env)

    async def aclose(self) -> None:
        """Close every runtime, then the gateway they lease from; the first error is raised once all are
        closed. A second call does nothing (the recipe's close and the `async with` may both call it)."""
        if self._closed:
            return
        self._closed = True
        try:
            errors: list[Exception] = []
            for runtime in self.all():
                try:
                    await runtime.close()
                except Exception as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
        finally:
            if self.gateway is not None:
                await self.gateway.astop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
