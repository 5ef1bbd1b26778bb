"""The recipes a config can name: its `recipe` key picks one's config model from `RECIPES`.

`config` imports no recipe. Each recipe's config model is registered by import path and imported the first
time a config (or the glossary) asks for it, so loading an SFT config never imports the RL recipe and the
layers stay one-way: recipes import `config`, never the reverse. A recipe from outside the package
registers itself the same way: `register_recipe("dpo", "my_pkg.dpo:DPOConfig")` (`RecipeRegistry.register`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from loops_nb.config.sections import RecipeConfig


class RecipeRegistry(Mapping[str, type[RecipeConfig]]):
    """Recipe name -> its config model, imported on first use from a `module:Class` path; and the module
    holding its `check` and `train` (what `Project` calls)."""

    def __init__(self, paths: Mapping[str, str]) -> None:
        self._paths = dict(paths)
        self._models: dict[str, type[RecipeConfig]] = {}
        self._recipe_modules: dict[str, str] = {}

    def register(self, name: str, model: str | type[RecipeConfig], recipe_module: str | None = None) -> None:
        """Make `recipe = "<name>"` load ``model`` (a `RecipeConfig` subclass or its `module:Class` path), and
        run with the `check` / `train` of ``recipe_module`` (default: ``recipe`` beside the model's module)."""
        self._paths[name] = model if isinstance(model, str) else f"{model.__module__}:{model.__qualname__}"
        self._models.pop(name, None)  # a path is imported on first use
        self._recipe_modules.pop(name, None)
        if not isinstance(model, str):
            self._models[name] = model
        if recipe_module is not None:
            self._recipe_modules[name] = recipe_module

    def recipe_module(self, name: str) -> str:
        """The module with the recipe's `check` and `train`: the registered one, or ``recipe`` beside the
        config model's module (``loops_nb.rl.config`` -> ``loops_nb.rl.recipe``)."""
        if name in self._recipe_modules:
            return self._recipe_modules[name]
        package = self._paths[name].partition(":")[0].rpartition(".")[0]
        return f"{package}.recipe" if package else "recipe"

    def __getitem__(self, name: str) -> type[RecipeConfig]:
        if name not in self._models:
            module, _, attribute = self._paths[name].partition(":")
            model = getattr(importlib.import_module(module), attribute)
            if not (isinstance(model, type) and issubclass(model, RecipeConfig)):
                raise TypeError(f"recipe {name!r}: {self._paths[name]} is not a RecipeConfig model")
            self._models[name] = model
        return self._models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, name: object) -> bool:
        return name in self._paths


RECIPES = RecipeRegistry({"rl": "loops_nb.rl.config:RLConfig", "sft": "loops_nb.sft.config:SFTConfig"})
"""Recipe name -> its config model."""


register_recipe = RECIPES.register
