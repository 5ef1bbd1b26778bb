"""The trained model's tokenizer, chat template and renderer, as `[model]` configures them, on any scope
(docs/reference/renderers.md): the local scope resolves the model like the embedded Loops does, the others
load only the tokenizer files from the Hub (HF_TOKEN for gated repos).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.config.sections import ModelConfig
from loops_nb.errors import ConfigError, UserError
from loops_nb.llm.renderer_choice import (
    RendererChoice,
    choose_renderer,
    family_renderer,
    renderer_config,
    renderer_names,
)
from loops_nb.llm.templates import BUILTIN_TEMPLATES as BUILTIN_TEMPLATES
from loops_nb.missing_package import install_line, missing_package

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.llm.renderer import Renderer

# BUILTIN_TEMPLATES (re-exported): the chat templates `[model] chat_template` can name.


def chat_template_override(model: ModelConfig) -> str | None:
    """The template text that replaces the tokenizer's own, if the config asks for one."""
    if model.chat_template is not None:
        if model.chat_template not in BUILTIN_TEMPLATES:
            raise ConfigError(
                f"model.chat_template = {model.chat_template!r}: built-in templates are "
                f"{', '.join(sorted(BUILTIN_TEMPLATES))}; use model.chat_template_file for your own"
            )
        return BUILTIN_TEMPLATES[model.chat_template]
    if model.chat_template_file is not None:
        try:
            return Path(model.chat_template_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"model.chat_template_file: cannot read {model.chat_template_file}: {exc.strerror}"
            ) from None
    return None


def load_model_tokenizer(model: ModelConfig, scope: str, *, cache_dir: Path | None = None) -> Any:
    """The tokenizer that renders this config's data, with the configured chat template."""
    source = model.tokenizer or model.base_model
    template = chat_template_override(model)
    if scope == "local" or Path(source).expanduser().is_dir():
        from loops_nb.local.model_store import load_tokenizer, resolve_model

        resolved = resolve_model(source, cache_dir=cache_dir)
        try:
            return load_tokenizer(resolved, chat_template=template)
        except ImportError as exc:
            if missing_package(exc) is None:
                raise
            raise UserError(tokenizer_problem(source, exc)) from None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise UserError(tokenizer_problem(source, exc)) from None
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def tokenizer_problem(source: str, exc: BaseException) -> str:
    """One line saying why the tokenizer of `source` did not load, and what to do about it."""
    package = missing_package(exc)
    if package is not None:
        return install_line(f"the tokenizer of {source!r}", package)
    text = " ".join(str(exc).split())
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline or "couldn't connect" in text or "offline mode" in text:
        why = "HF_HUB_OFFLINE is set" if offline else "huggingface.co is unreachable"
        return (
            f"cannot load the tokenizer of {source!r}: it is not in the Hugging Face cache and {why}; run "
            "once with network to cache it, or set [model] tokenizer to a local directory holding it"
        )
    first = text.split(". ")[0].rstrip(".")
    return (
        f"cannot load the tokenizer of {source!r}: {first[:300]}. Gated or private repos need HF_TOKEN; "
        "a local directory works too ([model] tokenizer)"
    )


def template_override_key(model: ModelConfig) -> str | None:
    """The config key that replaces the tokenizer's template, if one does."""
    if model.chat_template is not None:
        return "chat_template"
    if model.chat_template_file is not None:
        return "chat_template_file"
    return None


def model_renderer_choice(model: ModelConfig) -> RendererChoice:
    """Which renderer `[model]` gets, and why (without loading anything)."""
    return choose_renderer(model.renderer, model.base_model, template_override=template_override_key(model))


def run_renderer_choice(model: ModelConfig, run_json: Mapping[str, Any] | None) -> RendererChoice:
    """The renderer of a run: the one its run.json recorded when it started, so a later `renderers` (a new
    family in its table) or loops_nb never samples or resumes an older run with another renderer; resolved
    afresh for a run that recorded none (from before it did), or whose `[model] renderer` / template changed
    since (a resume that changed them)."""
    found = (run_json or {}).get("renderer")
    if (
        not isinstance(found, Mapping)
        or not isinstance(found.get("name"), str)
        or (found.get("setting"), found.get("template")) != (model.renderer, template_override_key(model))
    ):
        return model_renderer_choice(model)
    return RendererChoice(found["name"], str(found.get("why") or "recorded in run.json"))


def renderer_record(model: ModelConfig, run_json: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """run.json's `renderer` for a run starting with `model`: the name and why, and the settings it was
    resolved from (`run_renderer_choice` reuses the name only while those are unchanged); None when the
    setting names no renderer (the run's check has said so)."""
    try:
        choice = run_renderer_choice(model, run_json)
    except ConfigError:
        return None
    return {
        "name": choice.name,
        "why": choice.why,
        "setting": model.renderer,
        "template": template_override_key(model),
    }


def load_model_renderer(
    model: ModelConfig,
    scope: str,
    *,
    cache_dir: Path | None = None,
    run_json: Mapping[str, Any] | None = None,
) -> Renderer:
    """The renderer `[model]` chooses (the one a run's ``run_json`` recorded: `run_renderer_choice`) on the
    configured tokenizer, with the model's processor for images (`text_renderer`)."""
    from loops_nb.llm.renderer import CHAT_TEMPLATE
    from loops_nb.llm.vision import load_processor

    choice = run_renderer_choice(model, run_json)
    tokenizer = load_model_tokenizer(model, scope, cache_dir=cache_dir)
    source = model.base_model  # a vision-language model's processor (the `vision` extra) comes from it
    if scope == "local" or Path(source).expanduser().is_dir():
        from loops_nb.local.model_store import resolve_model

        source = str(resolve_model(source, cache_dir=cache_dir).path)
    if choice.name != CHAT_TEMPLATE:
        return text_renderer(model, tokenizer, choice, source)  # the family's renderer loads it at an image
    return text_renderer(model, tokenizer, choice, load_processor(source))


def text_renderer(
    model: ModelConfig, tokenizer: Any, choice: RendererChoice, processor: Any | None = None
) -> Renderer:
    """`choice`'s renderer on an already loaded `tokenizer`, its `why` saying how it was chosen: the family's
    `PrimeRenderer` with `[model] renderer_options` (images through `processor`, or the one it loads from the
    model `processor` names), else the template's `ChatRenderer`, or `VisionRenderer` on `processor`."""
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.renderer import CHAT_TEMPLATE, ChatRenderer
    from loops_nb.llm.vision import VisionRenderer

    renderer: Renderer
    if choice.name != CHAT_TEMPLATE:
        config = renderer_config(choice.name, model.renderer_options)
        renderer = PrimeRenderer(
            tokenizer, choice.name, hub_id=model.base_model, config=config, processor=processor
        )
    else:
        if model.renderer_options:
            raise ConfigError(
                "model.renderer_options apply to a family's renderer, and this model renders with its chat "
                f"template ({choice.why}); remove them, or set model.renderer to the family's renderer"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"{model.base_model!r} has no chat template and no renderer was named ({choice.why}): set "
                f"model.renderer to its family's renderer (one of {', '.join(renderer_names())}) or "
                "model.chat_template_file to a template"
            )
        if processor is None:
            renderer = ChatRenderer(tokenizer, parser=family_parser(model, tokenizer))
        else:
            processor.tokenizer = tokenizer
            renderer = VisionRenderer(processor, parser=family_parser(model, tokenizer))
    renderer.why = choice.why
    return renderer


def family_parser(model: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> Renderer | None:
    """The family's renderer that parses a chat template's replies, where `renderers` has one for `[model]
    base_model`: the model writes its family's syntax whatever renders its prompt. None where it has none or
    cannot build it for this tokenizer (then templates.py's parser reads the replies)."""
    from loops_nb.llm.prime_renderer import PrimeRenderer

    name = family_renderer(model.base_model)
    if name is None:
        return None
    try:
        return PrimeRenderer(tokenizer, name, hub_id=model.base_model)
    except ConfigError:
        return None
