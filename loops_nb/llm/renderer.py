"""The renderer seam, `Renderer` (a conversation to prompt tokens, sampled tokens to a reply, a training
conversation to its supervised targets: one object per model, so what trains is what samples), and its
implementation on the model's chat template, `ChatRenderer` (docs/reference/renderers.md, "The chat template's
renderer"). The other implementation is `PrimeRenderer` (prime_renderer.py); renderer_choice.py picks one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loops_nb.errors import UserError
from loops_nb.llm.chat_messages import ChatMessage, ParsedReply, ToolSpec, has_images
from loops_nb.llm.target_rule import (
    END_OF_TURN_TOKENS,
    ChatTemplateTargets,
    Refusal,
    SupervisedExamples,
    TargetChecks,
)
from loops_nb.llm.templates import ChatTemplate, parse_assistant_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.llm.capture import ModelCall

CHAT_TEMPLATE = "chat_template"
"""The name of `ChatRenderer`, as `[model] renderer` spells it."""


class Renderer(Protocol):
    """Messages in, prompt tokens out; sampled tokens in, reply out; a conversation in, its supervised targets
    out. What every model call and every SFT example goes through. The renderers here subclass it for its
    `prompt_tokens`, `encode` and `decode`."""

    name: str
    """`chat_template`, or the `renderers` name of a family's renderer (`qwen3`, `gpt-oss`, ...)."""
    why: str
    """How it was chosen (`[model] renderer`, renderer_choice.py), for `loops check`; empty when built
    directly."""
    tokenizer: Any
    stop_token_ids: list[int]
    """Tokens that end the assistant's turn: sampling stops at them."""
    extends_by_text: bool
    """True when a next turn extends the previous tokens by matching decoded text (`ChatRenderer`), so an
    assistant message sent back must be the exact sampled text (the gateway restores it); False when the
    renderer bridges on token ids and renders the message itself (`PrimeRenderer`)."""

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        previous: ModelCall | None = None,
    ) -> tuple[list[int], tuple[Any, ...]]:
        """The prompt's token ids (continuing `previous`, the attempt's latest call, exactly where it can)
        and its images (`model_input.PromptImage`; none for a text model)."""
        ...

    def prompt_tokens(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        previous: ModelCall | None = None,
    ) -> list[int]:
        """`render_prompt`'s token ids."""
        return self.render_prompt(messages, tools, previous)[0]

    def parse(
        self,
        completion_tokens: Sequence[int],
        *,
        prompt_tokens: Sequence[int] | None = None,
        tools: Sequence[ToolSpec] | None = None,
    ) -> ParsedReply:
        """The reply in `completion_tokens`. `prompt_tokens` (the prompt it was sampled for) tells a renderer
        whether the prompt opened a reasoning block; `tools` (the request's) types XML tool arguments."""
        ...

    def supervised_examples(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None,
        trained_turns: Sequence[int],
        checks: TargetChecks | None = None,
    ) -> SupervisedExamples:
        """The training examples of a conversation whose `trained_turns` (assistant message indices) train, by
        the target rule (target_rule.py): each turn's own tokens through its stop token, after the prompt this
        renderer samples it from. `Refusal` says why the conversation cannot train; `checks` (none: nothing)
        why what the row says did not survive."""
        ...

    def target_stop_tokens(self) -> list[str]:
        """The tokens that end a trained turn (a row's text may not hold them)."""
        ...

    # Text to ids and back exactly as every renderer needs it: no special tokens added on encode, no clean-up
    # on decode (either would change sampled tokens' text).
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: Sequence[int], *, skip_special: bool = False) -> str:
        text = self.tokenizer.decode(
            list(tokens), skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)  # a flat list of ids decodes to one string
        return text


def call_keys(calls: Sequence[Mapping[str, Any]] | None) -> list[tuple[Any, Any]]:
    """Tool calls compared by name and decoded arguments, so re-serialised JSON still matches."""
    out = []
    for call in calls or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            # ValueError: also an integer too long to convert; arguments are the agent's text.
            with contextlib.suppress(ValueError, RecursionError):
                args = json.loads(args)
        out.append((fn.get("name"), args))
    return out


class ChatRenderer(Renderer):
    """A tokenizer plus chat template: messages in, prompt tokens out; sampled tokens in, reply out; a
    conversation in, its targets out (`ChatTemplateTargets`).

    ``chat_template`` overrides the tokenizer's own (e.g. `TOOL_CAPABLE_CHATML_TEMPLATE` for SmolLM2 tool use);
    ``template_variables`` are passed to the template (e.g. ``enable_thinking``); ``stop_tokens`` end a trained
    turn (default: the eos token and the known end-of-turn tokens the tokenizer has and the template writes).
    ``parser``: the family's renderer (`PrimeRenderer`) that parses the replies where `renderers` covers the
    model's family; without one, templates.py's parser does (docs/reference/renderers.md, "The chat
    template's renderer").
    """

    name = CHAT_TEMPLATE
    extends_by_text = True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: str | None = None,
        *,
        template_variables: Mapping[str, Any] | None = None,
        stop_tokens: Sequence[str] | None = None,
        parser: Renderer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.parser = parser
        self.why = ""
        self.template = ChatTemplate(tokenizer, chat_template, template_variables)
        self._stop_tokens = stop_tokens
        self._targets: ChatTemplateTargets | None = None
        vocab = tokenizer.get_vocab()
        stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        stops |= {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        self.stop_token_ids: list[int] = sorted(stops)

    def render_text(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None) -> str:
        return self.template.render(
            list(messages), list(tools) if tools else None, add_generation_prompt=True
        )

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        previous: ModelCall | None = None,
    ) -> tuple[list[int], tuple[Any, ...]]:
        """The prompt for the next call (no images: `VisionRenderer` has them); extends `previous`'s prompt +
        completion (exact tokens) whenever the text allows."""
        if has_images(list(messages)):
            raise UserError(
                "an image part in the messages, but this model's renderer renders text only (the model is no "
                "vision-language model, and `renderers` has no image renderer for it)"
            )
        text = self.render_text(messages, tools)
        if previous is not None:
            before = previous.prompt_tokens + previous.completion_tokens
            prefix = self.decode(before)
            if text.startswith(prefix):
                return before + self.encode(text[len(prefix) :]), ()
        return self.encode(text), ()

    def parse(
        self,
        completion_tokens: Sequence[int],
        *,
        prompt_tokens: Sequence[int] | None = None,
        tools: Sequence[ToolSpec] | None = None,
    ) -> ParsedReply:
        if self.parser is not None:
            return self.parser.parse(completion_tokens, prompt_tokens=prompt_tokens, tools=tools)
        text = self.decode(completion_tokens, skip_special=True)
        # A template that opens the think block in the prompt (Qwen3.5/3.6) leaves only its end in the reply.
        opened = prompt_tokens is not None and self.decode(prompt_tokens[-4:]).rstrip().endswith("<think>")
        return parse_assistant_text(text, tools=tools, reasoning_open=opened)

    def targets(self) -> ChatTemplateTargets:
        """The target rule on this template, built on first use (it needs a fast tokenizer, which sampling
        does not): `ConfigError` when the tokenizer cannot train."""
        if self._targets is None:
            self._targets = ChatTemplateTargets(self.tokenizer, self.template, self._stop_tokens)
        return self._targets

    def supervised_examples(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None,
        trained_turns: Sequence[int],
        checks: TargetChecks | None = None,
    ) -> SupervisedExamples:
        if has_images(messages):
            raise Refusal(
                "the row has images, which train only through a family's image renderer (`[model] renderer` "
                "qwen3-vl, qwen3.5, qwen3.6, gemma4, kimi-k2.5), not through a chat template"
            )
        return self.targets().examples(messages, tools, trained_turns, checks)

    def target_stop_tokens(self) -> list[str]:
        return self.targets().stop_tokens
