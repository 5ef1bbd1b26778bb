"""`[model] renderer`: `auto` takes a family's renderer by the model's Hub id (also when the tokenizer comes
from a folder), a name takes that renderer, `chat_template` the template; bad input is one line naming the key
and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from family_tokenizers import FAMILIES
from pydantic import ValidationError

from loops_nb.config.sections import DEFAULT_MODEL, ModelConfig
from loops_nb.errors import ConfigError
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer import CHAT_TEMPLATE, ChatRenderer
from loops_nb.llm.renderer_choice import NO_FAMILY_RENDERER, RendererChoice, choose_renderer, renderer_names
from loops_nb.model_renderer import (
    load_model_renderer,
    model_renderer_choice,
    renderer_record,
    run_renderer_choice,
)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_auto_takes_the_family_renderer_by_hub_id(name: str) -> None:
    family = FAMILIES[name]
    choice = choose_renderer("auto", family.hub_id)
    assert choice.name == family.renderer
    assert choice.why.startswith("auto: ") and family.hub_id in choice.why


def test_auto_keeps_the_chat_template_where_renderers_has_no_renderer() -> None:
    from renderers.base import MODEL_RENDERER_MAP

    # The offline default is answered without importing `renderers`: `renderers` must agree it has none.
    assert not NO_FAMILY_RENDERER & set(MODEL_RENDERER_MAP)
    assert DEFAULT_MODEL in NO_FAMILY_RENDERER
    assert model_renderer_choice(ModelConfig()).name == CHAT_TEMPLATE
    assert choose_renderer("auto", "someone/Qwen3-8B-finetune").name == CHAT_TEMPLATE
    assert choose_renderer("auto", "/models/qwen3").name == CHAT_TEMPLATE
    # A template the config gives is what auto renders with, whatever the family.
    tools = ModelConfig(base_model="Qwen/Qwen3-8B", chat_template="chatml-tools")
    assert model_renderer_choice(tools) == choose_renderer("auto", "x", template_override="chat_template")
    assert model_renderer_choice(tools).why == "auto: model.chat_template is set"


def test_a_named_renderer_or_the_template_is_taken_as_named() -> None:
    assert choose_renderer("llama-3", "my-org/llama-finetune").name == "llama-3"
    assert choose_renderer("chat_template", "Qwen/Qwen3-8B").name == CHAT_TEMPLATE
    assert {"qwen3", "qwen3.6", "llama-3", "deepseek-v4", "gpt-oss"} <= set(renderer_names())
    assert not {"auto", "default", "custom", CHAT_TEMPLATE} & set(renderer_names())


def test_an_unknown_renderer_is_one_line_naming_the_key_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        choose_renderer("qwen-3", "Qwen/Qwen3-8B")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith('model.renderer = \'qwen-3\' is not a renderer: use "auto", "chat_template"')
    assert "qwen3, qwen3-vl" in message and "gpt-oss" in message


def test_a_named_renderer_and_a_template_together_are_refused() -> None:
    with pytest.raises(ValidationError, match='the template is used only by model.renderer = "auto" or'):
        ModelConfig(renderer="qwen3", chat_template="chatml-tools")
    assert ModelConfig(renderer="chat_template", chat_template="chatml-tools").renderer == CHAT_TEMPLATE


@pytest.fixture(scope="module")
def qwen36_folder(tmp_path_factory: pytest.TempPathFactory, family_tokenizer: Callable[[str], Any]) -> Path:
    """The Qwen3.6 tokenizer saved to a folder, as `[model] tokenizer` points at one (no chat template)."""
    folder = tmp_path_factory.mktemp("qwen36-tokenizer")
    family_tokenizer("qwen3.6").save_pretrained(folder)
    return folder


def test_a_tokenizer_from_a_folder_gets_the_renderer_of_the_hub_id(qwen36_folder: Path) -> None:
    model = ModelConfig(base_model="Qwen/Qwen3.6-35B-A3B", tokenizer=str(qwen36_folder))
    renderer = load_model_renderer(model, "serverless")
    assert isinstance(renderer, PrimeRenderer)
    assert (renderer.name, renderer.why) == (
        "qwen3.6",
        "auto: Qwen/Qwen3.6-35B-A3B is a qwen3.6 model in `renderers`' table",
    )
    assert renderer.tokenizer.name_or_path != "Qwen/Qwen3.6-35B-A3B"  # the folder's
    # The renderer reads its per-model defaults by the Hub id: Qwen3.5-0.8B does not think by default, so its
    # generation prompt closes an empty think block (read by the folder's name, it would open one).
    small = load_model_renderer(
        ModelConfig(base_model="Qwen/Qwen3.5-0.8B", tokenizer=str(qwen36_folder)), "serverless"
    )
    prompt = small.decode(small.prompt_tokens([{"role": "user", "content": "Hi"}]))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_model_with_neither_a_renderer_nor_a_template_is_one_line(qwen36_folder: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_model_renderer(ModelConfig(base_model=str(qwen36_folder)), "serverless")
    message = str(raised.value)
    assert "\n" not in message and "has no chat template" in message
    assert "set model.renderer to its family's renderer (one of " in message
    assert "or model.chat_template_file to a template" in message
    named = load_model_renderer(ModelConfig(base_model=str(qwen36_folder), renderer="qwen3.6"), "serverless")
    assert named.name == "qwen3.6" and named.why == "model.renderer = 'qwen3.6'"


def test_the_offline_default_stays_on_its_chat_template(model_cache_dir: Path) -> None:
    renderer = load_model_renderer(ModelConfig(), "local", cache_dir=model_cache_dir)
    assert isinstance(renderer, ChatRenderer) and renderer.name == CHAT_TEMPLATE
    assert renderer.why == "auto: `renderers` has no renderer for 'HuggingFaceTB/SmolLM2-135M-Instruct'"


def test_a_run_keeps_the_renderer_its_run_json_recorded(qwen36_folder: Path) -> None:
    model = ModelConfig(base_model="Qwen/Qwen3.6-35B-A3B", tokenizer=str(qwen36_folder))
    record = renderer_record(model, None)
    assert record == {
        "name": "qwen3.6",
        "why": "auto: Qwen/Qwen3.6-35B-A3B is a qwen3.6 model in `renderers`' table",
        "setting": "auto",
        "template": None,
    }
    # A later `renderers` could map the Hub id elsewhere: the run's recorded name wins while its settings hold.
    older = {"renderer": {**record, "name": "qwen3.5", "why": "auto: as it was"}}
    assert run_renderer_choice(model, older) == RendererChoice("qwen3.5", "auto: as it was")
    assert renderer_record(model, older) == {**record, "name": "qwen3.5", "why": "auto: as it was"}
    sampled = load_model_renderer(model, "serverless", run_json=older)
    assert (sampled.name, sampled.why) == ("qwen3.5", "auto: as it was")
    # Resolved afresh: a run from before the record, or one whose setting or template changed on a resume.
    assert run_renderer_choice(model, {}).name == "qwen3.6"
    assert run_renderer_choice(model, {"renderer": {**record, "setting": "chat_template"}}).name == "qwen3.6"
    assert run_renderer_choice(model, {"renderer": {**record, "template": "chat_template"}}).name == "qwen3.6"
    assert run_renderer_choice(model, {"renderer": "qwen3.5"}).name == "qwen3.6"
    # SFT records nothing for a name that is no renderer (its check warned; it trains on the template).
    assert renderer_record(ModelConfig(renderer="qwen-3"), None) is None


def test_a_renderer_whose_package_is_missing_is_one_line_naming_it(
    tmp_path: Path, family_tokenizer: Callable[[str], Any]
) -> None:
    """gpt-oss's renderer imports openai-harmony; without it, one line says what to add. In a fresh interpreter
    where the package cannot be imported (this one may have imported it already)."""
    import subprocess
    import sys

    family_tokenizer("gpt-oss").save_pretrained(tmp_path)
    script = (
        "import sys; sys.modules['openai_harmony'] = None\n"  # what a package that is not installed looks like
        "from transformers import AutoTokenizer\n"
        "from loops_nb.errors import ConfigError\n"
        "from loops_nb.llm.prime_renderer import PrimeRenderer\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(tmp_path)!r})\n"
        "try:\n    PrimeRenderer(tokenizer, 'gpt-oss')\nexcept ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == (
        "[model] renderer 'gpt-oss' needs the Python package 'openai-harmony', which is not installed: run "
        "`uv add openai-harmony`"
    ), out.stderr[-2000:]


def test_a_tokenizer_whose_package_is_missing_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' own words for a SentencePiece tokenizer without the package, as a user meets them."""
    from transformers import AutoTokenizer
    from transformers.utils.import_utils import SENTENCEPIECE_IMPORT_ERROR

    from loops_nb.errors import UserError
    from loops_nb.model_renderer import load_model_tokenizer

    def needs_sentencepiece(*_: Any, **__: Any) -> Any:
        raise ImportError(SENTENCEPIECE_IMPORT_ERROR.format("GemmaTokenizer"))

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", needs_sentencepiece)
    with pytest.raises(UserError) as raised:
        load_model_tokenizer(ModelConfig(base_model="google/gemma-2-2b-it"), "serverless")
    assert str(raised.value) == (
        "the tokenizer of 'google/gemma-2-2b-it' needs the Python package 'sentencepiece', which is not "
        "installed: run `uv add sentencepiece`"
    )
