"""Reading a config: the file, its path rules, `.env` files, dotted overrides and clear errors.

The path and `.env` rules are README.md's ("Use it as a library"); each function below keeps one of them.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import tomllib
import types
import typing
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from loops_nb.config.schema import RECIPES
from loops_nb.config.sections import CONFIG_RELATIVE, CWD_RELATIVE, RecipeConfig
from loops_nb.errors import ConfigError
from loops_nb.shipped import find_shipped
from loops_nb.validation_message import problems

SHIPPED_NOTE = "the copy shipped with loops_nb: there is none at that path here, and one there would win"


@dataclass(frozen=True)
class ConfigSource:
    """Where a config came from and what it pulled in."""

    given: Path
    """The path as named by the user, made absolute against the working directory."""
    path: Path
    """The file actually read: the symlink's target or the shipped copy."""
    env_files: tuple[Path, ...] = ()
    """The `.env` files that were read, in order."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Dotted overrides applied on top of the file."""

    @property
    def shipped(self) -> bool:
        """Whether the file read is the copy shipped with loops_nb, not one the user has."""
        return self.path != self.given and not self.given.exists()

    def describe(self, output_dir: Path) -> list[str]:
        """The header lines `loops check` prints and a run's run.log begins with."""
        arrow = f" -> {self.path}" if self.path != self.given else ""
        if self.shipped:
            arrow += f" ({SHIPPED_NOTE})"
        env = ", ".join(str(p) for p in self.env_files) or "none"
        return [
            f"Config: {self.given}{arrow}",
            f"  paths, modules: beside {self.path.parent}",
            f"  .env: {env}",
            f"  runs: {output_dir}",
        ]


def resolve_config_path(name: str | os.PathLike[str], cwd: Path) -> tuple[Path, Path]:
    """(the path as given, made absolute; the file to read)."""
    given = Path(name).expanduser()
    absolute = given if given.is_absolute() else cwd / given
    if absolute.exists():
        if absolute.is_dir():
            raise ConfigError(f"{absolute}: is a directory; name a .toml or .json config file in it")
        return absolute, absolute.resolve()
    shipped = None if given.is_absolute() else find_shipped(given)
    if shipped is not None and shipped.is_file():
        return absolute, shipped.resolve()
    raise ConfigError(f"{absolute}: no such config file (and no shipped copy at that path)")


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw table of a TOML or JSON config; syntax errors name the file and position."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table of settings")
    return data


def parse_override_value(text: str) -> Any:
    """A CLI override's value: a TOML literal when it parses as one (5, true, [1, 2], "x"), else text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_overrides(args: Sequence[str]) -> dict[str, Any]:
    """`--training.max_steps 5` / `--training.max_steps=5` pairs into {"training.max_steps": 5}."""
    overrides: dict[str, Any] = {}
    items = iter(args)
    for item in items:
        if not item.startswith("--") or len(item) == 2:
            raise ConfigError(f"unexpected argument {item!r}: settings are given as --KEY VALUE (see --help)")
        key, eq, value = item[2:].partition("=")
        given = value if eq else next(items, None)
        if given is None:
            raise ConfigError(f"--{key} needs a value")
        overrides[key] = parse_override_value(given)
    return overrides


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `raw` with each dotted key set; a key through a non-table value is refused."""
    merged = json.loads(json.dumps(raw, default=str)) if raw else {}
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError(f"override {dotted!r}: not a dotted key such as training.max_steps")
        table = merged
        for i, part in enumerate(parts[:-1]):
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"override {dotted!r}: {where} is a value, not a table")
            table = nxt
        table[parts[-1]] = value
    return merged


def _path_kind(annotation: object) -> str | None:
    """CONFIG_RELATIVE / CWD_RELATIVE when the annotation is (an optional) marked path."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # Annotated[T, *metadata]
        return next((str(extra) for extra in args[1:] if extra in (CONFIG_RELATIVE, CWD_RELATIVE)), None)
    if origin in (typing.Union, types.UnionType):
        return next(filter(None, map(_path_kind, args)), None)
    return None


def models_in(annotation: object) -> list[type[BaseModel]]:
    """The config models an annotation holds (itself, or inside a union, `Annotated` or container), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in models_in(arg)]


def resolve_paths(
    raw: dict[str, Any],
    model: type[BaseModel],
    base_dir: Path,
    cwd: Path,
    overridden: Container[str],
    prefix: str = "",
) -> None:
    """Make every path value absolute, in place, by the path rules above."""
    for name, info in model.model_fields.items():
        key, value = f"{prefix}{name}", raw.get(name)
        kind = _path_kind(info.rebuild_annotation())
        if kind and isinstance(value, str):
            # An absolute value stays as it is: `anchor / absolute` is `absolute`.
            anchor = cwd if (kind == CWD_RELATIVE or key in overridden) else base_dir
            raw[name] = str(anchor / Path(value).expanduser())
        elif not kind and isinstance(value, dict) and (subs := models_in(info.annotation)):
            resolve_paths(value, subs[0], base_dir, cwd, overridden, key + ".")


def make_importable(config_dir: Path) -> None:
    """Put the config's directory first on `sys.path`, and forget same-named modules from elsewhere.

    Patterns share module names (`episode.py`, `agent.py`): after one config's `episode` was imported, a
    second config in the same process (a notebook kernel) must get its own `episode`, not the cached one.
    """
    here = str(config_dir)
    if here in sys.path:
        sys.path.remove(here)
    sys.path.insert(0, here)
    for path in config_dir.glob("*.py"):
        module = sys.modules.get(path.stem)
        origin = getattr(module, "__file__", None)
        if module is not None and origin and Path(origin).resolve().parent != config_dir.resolve():
            del sys.modules[path.stem]


def load_env_file(path: Path) -> bool:
    """Set the variables of a `.env` file that the process does not already set."""
    from dotenv import dotenv_values

    if not path.is_file():
        return False
    for key, value in dotenv_values(path).items():
        if value is not None and key not in os.environ:
            os.environ[key] = value
    return True


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    for part in loc[:-1]:
        found = models_in(model.model_fields[part].annotation) if part in model.model_fields else []
        if not found:
            return []
        model = found[0]
    return sorted(model.model_fields)


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], source: Path, overrides: Mapping[str, Any]
) -> str:
    """One line per problem: the file, the key path, what is wrong and what would be valid."""
    lines = []
    for problem in problems(exc, skip=RECIPES):
        key = problem.path or "(top level)"
        origin = f"override --{key}" if key in overrides else str(source)
        if problem.kind == "extra_forbidden":
            valid = _valid_keys(model, problem.loc)
            hint = difflib.get_close_matches(str(problem.loc[-1]), valid, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            lines.append(f"{origin}: unknown key {key}{suggestion} (valid here: {', '.join(valid)})")
        elif problem.kind == "missing":
            lines.append(f"{origin}: {key} is required")
        else:
            show = problem.kind != "value_error" and not isinstance(problem.given, dict)
            lines.append(
                f"{origin}: {key}: {problem.message}" + (f" (got {problem.given!r})" if show else "")
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class LoadedConfig:
    config: RecipeConfig
    source: ConfigSource


def load_config(
    path: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    env_files: Iterable[str | os.PathLike[str]] = (),
    cli_env: bool = False,
) -> LoadedConfig:
    """Read, override, path-resolve and validate a config.

    `env_files` are relative to the config's directory; `cli_env=True` also reads `.env` beside the
    config and in the working directory, as the `loops` CLI does.
    """
    cwd = Path.cwd().resolve()
    overrides = dict(overrides or {})
    given, real = resolve_config_path(path, cwd)
    raw = apply_overrides(read_config_file(real), overrides)

    recipe = raw.get("recipe")
    if not isinstance(recipe, str) or recipe not in RECIPES:
        valid = " or ".join(f'"{r}"' for r in RECIPES)
        got = "missing" if recipe is None else f"{recipe!r}"
        raise ConfigError(f"{real}: recipe is {got}; set recipe = {valid}")
    model = RECIPES[recipe]

    explicit = [real.parent / Path(p) for p in env_files]
    if missing := next((p for p in explicit if not p.is_file()), None):
        raise ConfigError(f"{missing}: env_file not found (it is relative to the config)")
    loaded_env: list[Path] = []
    for env_path in explicit + ([real.parent / ".env", cwd / ".env"] if cli_env else []):
        if env_path not in loaded_env and load_env_file(env_path):
            loaded_env.append(env_path)

    resolve_paths(raw, model, real.parent, cwd, overrides)
    try:
        config = model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, real, overrides)) from None
    config.output.output_dir = (
        cwd / config.output.output_dir
    )  # the default is relative; an absolute one stays

    make_importable(real.parent)
    source = ConfigSource(given=given, path=real, env_files=tuple(loaded_env), overrides=overrides)
    return LoadedConfig(config=config, source=source)
