"""Which renderer a model gets (`[model] renderer`): the model's chat template, or its family's renderer from
Prime Intellect's `renderers` package (docs/reference/renderers.md, "Which renderer").

`renderers` is imported only when the answer needs it: its import pulls in `openai` (seconds on a busy
machine), and the offline default model, which has no family renderer, should not pay for it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from loops_nb.errors import ConfigError
from loops_nb.llm.renderer import CHAT_TEMPLATE

if TYPE_CHECKING:
    from renderers.configs import BaseRendererConfig

AUTO = "auto"
NOT_RENDERERS = frozenset({AUTO, "default", "custom"})
"""`renderers` config names that are no family's renderer: its own auto lookup, its chat-template fallback
(`chat_template` is ours), and renderers loaded from an import path."""
NO_FAMILY_RENDERER = frozenset({"HuggingFaceTB/SmolLM2-135M-Instruct"})
"""Models known to have no family renderer (the offline default; a test checks `renderers` agrees), so `auto`
answers without importing `renderers`."""


@dataclass(frozen=True)
class RendererChoice:
    name: str
    """`chat_template`, or a `renderers` name."""
    why: str
    """Why, in words `loops check` prints."""


@functools.cache
def _configs() -> dict[str, type[BaseRendererConfig]]:
    """`renderers`' config class of each family renderer, by name (read from its public config union)."""
    from renderers import RendererConfig

    union = get_args(RendererConfig)[0]
    classes = {cls.model_fields["name"].default: cls for cls in get_args(union)}
    return {name: cls for name, cls in classes.items() if name not in NOT_RENDERERS}


def renderer_names() -> list[str]:
    """The names `[model] renderer` takes besides `auto` and `chat_template`."""
    return sorted(_configs())


def renderer_config(name: str, options: Mapping[str, Any] | None = None) -> BaseRendererConfig:
    """The config of `renderers`' renderer `name`: its defaults, with `options` (`[model] renderer_options`)
    set; an option the family does not have, or a value it refuses, is a `ConfigError` naming the key."""
    from pydantic import ValidationError

    from loops_nb.validation_message import problems

    cls = _configs()[name]
    if not options:
        return cls()
    known = sorted(k for k in cls.model_fields if k != "name")
    for key in options:
        if key == "name" or key not in cls.model_fields:
            raise ConfigError(
                f"model.renderer_options.{key}: {name} has no such option; its options are {', '.join(known)}"
            )
    try:
        return cls(**options)
    except ValidationError as exc:
        problem = problems(exc)[0]
        where = problem.path or next(iter(options))
        raise ConfigError(f"model.renderer_options.{where}: {problem.message} (renderer {name})") from None


def reasoning_kept(config: BaseRendererConfig) -> BaseRendererConfig:
    """`config`, set to render every assistant turn's reasoning: how a turn's own tokens are written (the
    family's generation prompt is unchanged, only history retention differs). Families name the knob
    differently: gpt-oss `auto_drop_analysis`, Qwen3.5/3.6 `preserve_thinking`, DeepSeek V4 `drop_thinking`,
    the others `renderers`' generic `thinking_retention`."""
    from pydantic import ValidationError

    fields = type(config).model_fields
    for key, value in (("auto_drop_analysis", False), ("preserve_thinking", True), ("drop_thinking", False)):
        if key in fields:
            return config.model_copy(update={key: value})
    try:
        return type(config)(**{**config.model_dump(), "thinking_retention": "all"})
    except ValidationError:  # a family whose template knobs decide retention: render as configured
        return config


def family_renderer(hub_id: str) -> str | None:
    """The renderer `renderers` tests the checkpoint `hub_id` against, if any."""
    if hub_id in NO_FAMILY_RENDERER:
        return None
    from renderers.base import MODEL_RENDERER_MAP

    name = MODEL_RENDERER_MAP.get(hub_id)
    return name if name in _configs() else None


def choose_renderer(setting: str, base_model: str, *, template_override: str | None = None) -> RendererChoice:
    """The renderer for `[model] renderer = setting` on `base_model`; `template_override` names the config key
    that replaces the tokenizer's template (a replaced template is what `auto` then renders with)."""
    if setting == CHAT_TEMPLATE:
        return RendererChoice(CHAT_TEMPLATE, 'model.renderer = "chat_template"')
    if setting == AUTO:
        if template_override:
            return RendererChoice(CHAT_TEMPLATE, f"auto: model.{template_override} is set")
        name = family_renderer(base_model)
        if name is None:
            return RendererChoice(CHAT_TEMPLATE, f"auto: `renderers` has no renderer for {base_model!r}")
        return RendererChoice(name, f"auto: {base_model} is a {name} model in `renderers`' table")
    if setting in _configs():
        return RendererChoice(setting, f"model.renderer = {setting!r}")
    raise ConfigError(
        f'model.renderer = {setting!r} is not a renderer: use "auto", "chat_template" or one of '
        f"`renderers`' {', '.join(renderer_names())}"
    )
