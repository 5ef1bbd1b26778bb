"""`load()` and `Project`: a config, ready to check or train, from a notebook, a script or the CLI.

`check()`, `train()` and `evaluate()` do exactly what `loops check`, `loops run` and `loops eval` do (the CLI
calls them); each is awaitable inside a notebook's running loop, and has a `_sync` twin for plain scripts.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from loops_nb.config import RECIPES, ConfigSource, RecipeConfig, load_config
from loops_nb.errors import UserError

if TYPE_CHECKING:
    from loops_nb.policy_sampler import PolicySampler
    from loops_nb.run.run_outcome import Outcome


class Report(Protocol):
    def describe(self) -> list[str]: ...


@dataclass
class Project:
    """A loaded config: `path` (the file read), `source` (where it and its .env came from), `config`."""

    path: Path
    source: ConfigSource
    config: RecipeConfig

    def config_as[C: RecipeConfig](self, model: type[C]) -> C:
        """The config as the recipe's own model (what a recipe reads its settings through)."""
        if not isinstance(self.config, model):
            raise TypeError(f"{self.path} is a {self.recipe!r} config, not a {model.__name__}")
        return self.config

    @property
    def recipe(self) -> str:
        return self.config.recipe

    def describe(self) -> list[str]:
        """The header lines: which config, where its paths and modules resolve, .env files, runs."""
        return self.source.describe(self.config.output.output_dir)

    def _recipe_module(self) -> Any:
        return importlib.import_module(RECIPES.recipe_module(self.recipe))

    async def check(self, **options: object) -> Report:
        """Resolve, render and prepare without training; returns the recipe's report."""
        return await self._recipe_module().check(self, **options)

    async def train(self, **options: object) -> Outcome:
        """Run the recipe (resuming the run directory if it exists); returns the run's Outcome."""
        return await self._recipe_module().train(self, **options)

    async def evaluate(self, **options: object) -> Report:
        """Only the recipe's evaluation, of a checkpoint (RL: ``checkpoint="base"|"latest"|<name>``, ``out``):
        what `loops eval` does; awaitable inside a notebook's loop."""
        module = self._recipe_module()
        if not hasattr(module, "evaluate"):
            raise UserError(
                f"{self.path} is a {self.recipe!r} config: `loops eval` evaluates RL configs (an SFT run measures "
                "its held-out loss while it trains: evals.jsonl)"
            )
        return await module.evaluate(self, **options)

    def run_dir(self) -> Path:
        """This config's run directory: ``output.run_name``'s, else the latest run made from this config."""
        output = self.config.output
        if output.run_name:
            return output.output_dir / output.run_name
        made = []
        for run_json in output.output_dir.glob("*/run.json"):
            try:
                record = json.loads(run_json.read_text())
            except (OSError, ValueError):
                continue
            if record.get("config_path") == str(self.path):
                made.append((float(record.get("started") or 0), run_json.parent))
        if not made:
            raise UserError(
                f"no run of {self.path} in {output.output_dir}: train first, or set output.run_name (or pass run=)"
            )
        return max(made)[1]

    def sampler(
        self, checkpoint: str | int = "latest", *, run: str | os.PathLike[str] | None = None
    ) -> PolicySampler:
        """A handle to chat with a checkpoint of this config's run (``latest``, a step, a name, or ``base``);
        ``run``: another run directory. See `loops_nb.policy_sampler`."""
        from loops_nb.policy_sampler import PolicySampler

        return PolicySampler(run if run is not None else self.run_dir(), checkpoint)

    def check_sync(self, **options: object) -> Report:
        """`check()` for plain scripts with no running event loop."""
        return _run_sync(self.check(**options))

    def train_sync(self, **options: object) -> Outcome:
        """`train()` for plain scripts with no running event loop."""
        return _run_sync(self.train(**options))

    def evaluate_sync(self, **options: object) -> Report:
        """`evaluate()` for plain scripts with no running event loop."""
        return _run_sync(self.evaluate(**options))


def _run_sync[T](coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("an event loop is running here (a notebook?): use `await project.check()` instead")


def load(
    path: str | os.PathLike[str],
    *,
    overrides: Mapping[str, Any] | None = None,
    env_file: str | os.PathLike[str] | None = None,
) -> Project:
    """Read a TOML or JSON config; its `recipe` key picks RL or SFT. Paths and `env_file` follow README.md's
    rules ("Use it as a library"): `env_file` is relative to the config and read only when passed."""
    loaded = load_config(path, overrides, env_files=[env_file] if env_file is not None else [])
    return Project(path=loaded.source.path, source=loaded.source, config=loaded.config)
