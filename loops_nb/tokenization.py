"""The trained model's tokenizer and chat template, as `[model]` configures them, on any scope.

The local scope resolves the model like the embedded Loops does (the offline default included);
serverless and dedicated load only the tokenizer files from the Hub (HF_TOKEN for gated repos).
`[model] tokenizer` replaces the base model's tokenizer; `chat_template` / `chat_template_file`
replace its template.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loops_nb.config.sections import ModelConfig
from loops_nb.errors import ConfigError, UserError
from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE

BUILTIN_TEMPLATES = {"chatml-tools": TOOL_CAPABLE_CHATML_TEMPLATE}
"""Chat templates `[model] chat_template` can name."""


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

        return load_tokenizer(resolve_model(source, cache_dir=cache_dir), chat_template=template)
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


def load_model_processor(model: ModelConfig, scope: str, *, cache_dir: Path | None = None) -> Any | None:
    """The base model's processor when it is a vision-language model (the `vision` extra), else None."""
    from loops_nb.llm.vision import load_processor

    source = model.base_model
    if scope == "local" or Path(source).expanduser().is_dir():
        from loops_nb.local.model_store import resolve_model

        source = str(resolve_model(source, cache_dir=cache_dir).path)
    return load_processor(source, cache_dir=cache_dir)


def load_model_renderer(model: ModelConfig, scope: str, *, cache_dir: Path | None = None) -> Any:
    """The run's renderer: a `VisionRenderer` (images through the processor) for a vision-language model,
    else a `ChatRenderer`; both use the configured tokenizer and chat template."""
    from loops_nb.llm.renderer import ChatRenderer

    tokenizer = load_model_tokenizer(model, scope, cache_dir=cache_dir)
    processor = load_model_processor(model, scope, cache_dir=cache_dir)
    if processor is None:
        return ChatRenderer(tokenizer)
    from loops_nb.llm.vision import VisionRenderer

    processor.tokenizer = tokenizer
    return VisionRenderer(processor)
