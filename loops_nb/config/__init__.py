"""Configs: typed schema, path rules, overrides and the generated knob glossary."""

from loops_nb.config.loader import ConfigSource, LoadedConfig, load_config, parse_override_value
from loops_nb.config.schema import RECIPES, AnyConfig

__all__ = ["RECIPES", "AnyConfig", "ConfigSource", "LoadedConfig", "load_config", "parse_override_value"]
