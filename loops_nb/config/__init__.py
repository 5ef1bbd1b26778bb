"""Configs: typed schema, path rules, overrides and the generated knob glossary."""

from loops_nb.config.loader import (
    ConfigSource,
    LoadedConfig,
    load_config,
    parse_override_value,
    split_overrides,
)
from loops_nb.config.schema import RECIPES, register_recipe
from loops_nb.config.sections import RecipeConfig

__all__ = [
    "RECIPES",
    "ConfigSource",
    "LoadedConfig",
    "RecipeConfig",
    "load_config",
    "parse_override_value",
    "register_recipe",
    "split_overrides",
]
