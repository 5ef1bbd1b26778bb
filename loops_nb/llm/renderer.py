"""Rendering a conversation into prompt tokens with the model's own chat template, reusing the
exact sampled tokens of earlier turns.

For turn n+1 the conversation is rendered to text. When that text starts with the decoded text of
turn n's prompt + sampled completion, the new prompt is those exact tokens followed by the tokens of
the new suffix (tool results, the next user message, the generation header): sampled tokens are never
re-tokenized. When it does not (the template re-rendered history, e.g. dropped earlier reasoning),
the whole conversation is tokenized afresh and the capture starts a new training sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loops_nb.llm.templates import ChatTemplate, parse_assistant_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>")
"""Tokens that end an assistant turn in common chat templates; those in the vocabulary stop sampling."""


@dataclass(frozen=True)
class ParsedReply:
    text: str
    """The completion's text, special tokens removed."""
    content: str
    """The prose, with tool-call blocks removed."""
    tool_calls: list[dict[str, Any]]
    """OpenAI-shaped tool calls (`{"id", "type": "function", "function": {"name", "arguments"}}`)."""
    tool_call_errors: list[str]


class ChatRenderer:
    """A tokenizer plus chat template: messages in, prompt tokens out; sampled tokens in, reply out."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tokenizer, chat_template)
        vocab = tokenizer.get_vocab()
        stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        stops |= {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        self.stop_token_ids: list[int] = sorted(stops)

    def render_text(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        return self.template.render(
            list(messages), list(tools) if tools else None, add_generation_prompt=True
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: Sequence[int], *, skip_special: bool = False) -> str:
        text = self.tokenizer.decode(
            list(tokens), skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)  # a flat list of ids decodes to one string
        return text

    def prompt_tokens(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        previous: Sequence[int] | None = None,
    ) -> list[int]:
        """The prompt for the next call; extends `previous` (exact tokens) whenever the text allows."""
        text = self.render_text(messages, tools)
        if previous:
            prefix = self.decode(previous)
            if text.startswith(prefix):
                return list(previous) + self.encode(text[len(prefix) :])
        return self.encode(text)

    def render_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        previous: Sequence[int] | None = None,
    ) -> tuple[list[int], tuple[Any, ...]]:
        """The prompt's token ids and its images (`vision.PromptImage`; none for a text model)."""
        return self.prompt_tokens(messages, tools, previous), ()

    def parse(self, completion_tokens: Sequence[int]) -> ParsedReply:
        text = self.decode(completion_tokens, skip_special=True)
        reply = parse_assistant_text(text)
        return ParsedReply(
            text=text,
            content=reply.content,
            tool_calls=reply.openai_tool_calls(),
            tool_call_errors=list(reply.errors),
        )
