"""On the chat-template path, replies are parsed by the family's renderer wherever `renderers` has one for the
model (`family_parser`): the model writes its family's syntax whatever renders its prompt. The hand parser of
templates.py reads the rest (SmolLM2's `chatml-tools`, models `renderers` does not know)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from family_replies import FAMILY_REPLIES, TOOLS

from loops_nb.config.sections import ModelConfig
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer import ChatRenderer, call_keys
from loops_nb.model_renderer import family_parser, model_renderer_choice, text_renderer

LLAMA_LIKE_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_a_chat_template_parses_replies_by_the_family_renderer(
    family_tokenizer: Callable[[str], Any],
) -> None:
    tokenizer = family_tokenizer("llama-3")
    model = ModelConfig(base_model=tokenizer.name_or_path, renderer="chat_template")
    parser = family_parser(model, tokenizer)
    assert isinstance(parser, PrimeRenderer) and parser.name == "llama-3"
    reply = FAMILY_REPLIES["llama-3"].call_reply
    by_family = ChatRenderer(tokenizer, LLAMA_LIKE_TEMPLATE, parser=parser)
    ids = by_family.encode(reply)
    assert call_keys(by_family.parse(ids, tools=TOOLS).tool_calls) == [("get_weather", {"city": "Rome"})]
    assert by_family.parse(ids, tools=TOOLS) == parser.parse(ids, tools=TOOLS)
    # The hand parser reads `<tool_call>` blocks only: Llama 3's bare JSON call is prose to it.
    assert ChatRenderer(tokenizer, LLAMA_LIKE_TEMPLATE).parse(ids, tools=TOOLS).tool_calls == []

    own, tokenizer.chat_template = tokenizer.chat_template, LLAMA_LIKE_TEMPLATE
    try:
        built = text_renderer(model, tokenizer, model_renderer_choice(model))
    finally:
        tokenizer.chat_template = own
    assert isinstance(built, ChatRenderer) and isinstance(built.parser, PrimeRenderer)


def test_a_model_renderers_does_not_know_keeps_the_hand_parser(
    family_tokenizer: Callable[[str], Any],
) -> None:
    tokenizer = family_tokenizer("qwen3")
    assert family_parser(ModelConfig(), tokenizer) is None  # the offline default, SmolLM2
    assert (
        family_parser(ModelConfig(base_model="./my-fine-tune", renderer="chat_template"), tokenizer) is None
    )
