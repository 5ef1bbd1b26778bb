"""Configs: typed schema, path rules, overrides and the generated knob glossary."""

from loops_nb.config.loader import ConfigSource, load_config, split_overrides
from loops_nb.config.schema import RECIPES, register_recipe
from loops_nb.config.sections import RecipeConfig

__all__ = [
    "RECIPES",
    "ConfigSource",
    "RecipeConfig",
    "load_config",
    "register_recipe",
    "split_overrides",
]
