"""`PrimeRenderer`: a model family's own renderer from Prime Intellect's `renderers` package, behind the
`Renderer` seam (docs/reference/renderers.md, "`PrimeRenderer`"; its images: vision_and_custom_loss.md).

The renderer is named explicitly (renderer_choice.py picks the name from the model's Hub id), never left to
`renderers`' own lookup of `tokenizer.name_or_path`: a tokenizer loaded from a folder misses that lookup, and
the fallback asks the Hub for the model's config, which fails offline and silently falls back to the chat
template.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loops_nb.errors import ConfigError, UserError
from loops_nb.llm.breaks import continuation_start
from loops_nb.llm.chat_messages import ChatMessage, ParsedReply, ToolCall, ToolSpec, is_image_part, tool_call
from loops_nb.llm.model_input import PromptImage
from loops_nb.llm.renderer import Renderer
from loops_nb.llm.target_rule import (
    Refusal,
    SupervisedExamples,
    TargetChecks,
    opening_turn,
    render_failed,
    split_reason,
    turn_groups,
    weighted_example,
)

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage
    from renderers import MultiModalData, ParsedResponse, RenderedTokens
    from renderers.configs import BaseRendererConfig
    from transformers import ProcessorMixin

    from loops_nb.llm.capture import ModelCall


PARSES_KEPT = 64
"""Parsed replies a renderer keeps: enough for the attempts sampling at once to each find its previous one."""


class PrimeRenderer(Renderer):
    """A `Renderer` for one model family, wrapping `renderers`' hand-written renderer `name` (`qwen3`, ...)."""

    extends_by_text = False

    def __init__(
        self,
        tokenizer: Any,
        name: str,
        *,
        hub_id: str | None = None,
        config: BaseRendererConfig | None = None,
        processor: ProcessorMixin | str | None = None,
    ) -> None:
        """`hub_id`: the model's Hub id, which some renderers read for per-model defaults (Qwen3.5's thinking
        default, Gemma 4's small variants); `config`: a `renderers` config with options (default: `name`'s);
        `processor`: the model's processor for image parts, or the model (Hub id or folder) to load it from
        at the first image (a text-only run never loads it)."""
        from renderers import create_renderer

        from loops_nb.llm.renderer_choice import renderer_config

        self.name = name
        self.why = ""
        self.tokenizer = tokenizer
        self.hub_id = hub_id
        self.config = config if config is not None else renderer_config(name)
        self.processor = processor
        self._images_ready = False
        self._kept: PrimeRenderer | None = None
        self._parsed: dict[tuple[Any, ...], ParsedReply] = {}
        self._parsed_lock = threading.Lock()
        named = tokenizer
        if hub_id and getattr(tokenizer, "name_or_path", None) != hub_id:
            # A shallow copy that answers to the Hub id; the vocabulary itself is shared, not copied.
            named = copy.copy(tokenizer)
            named.name_or_path = hub_id
        self._named = named
        try:
            self.prime = create_renderer(named, self.config)
        except Exception as exc:
            raise ConfigError(renderer_problem(name, exc)) from None
        self.stop_token_ids: list[int] = sorted(set(self.prime.get_stop_token_ids()))

    # -- the seam -----------------------------------------------------------------------------------------

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        previous: ModelCall | None = None,
    ) -> tuple[list[int], tuple[PromptImage, ...]]:
        """The prompt: `previous`'s prompt + completion, exactly, then the new turns, when the conversation
        continues `previous` and the family's renderer can bridge; else the whole conversation rendered."""
        spec = list(tools) if tools else None
        converted = self._prime_messages(messages)
        if previous is not None:
            # Where the new turns start in `messages` when they continue `previous`; None for another
            # conversation or an edited history, rendered afresh (the capture starts a new sequence, counted
            # as `history_edited`).
            start = continuation_start(self, messages, tools, previous)
            if start is not None:
                # Earlier images ride along (their runs sit before the new turns), so that the family's
                # renderer numbers the new ones after them and the prompt keeps them all.
                carried = (
                    {"previous_multi_modal_data": carried_images(previous.images)}
                    if self._images_ready
                    else {}
                )
                bridged = self.prime.bridge_to_next_turn(
                    list(previous.prompt_tokens),
                    list(previous.completion_tokens),
                    converted[start:],
                    tools=spec,
                    **carried,
                )
                if bridged is not None:
                    return list(bridged.token_ids), prompt_images(bridged, converted[start:], previous.images)
        rendered = self.prime.render(converted, tools=spec, add_generation_prompt=True)
        return list(rendered.token_ids), prompt_images(rendered, converted)

    def _prime_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
        """`to_prime_messages`, readying the family's renderer for images when the messages have some."""
        converted = to_prime_messages(messages)
        if not self._images_ready and any(True for _ in message_images(converted)):
            self._ready_images()
        return converted

    def _ready_images(self) -> None:
        """Rebuild the family's renderer with the model's processor (loaded now, at the first image)."""
        from renderers import is_multimodal

        if not is_multimodal(self.prime):
            raise UserError(
                f"an image part in the messages, and `renderers` has no image renderer for {self.name!r} (it "
                "renders images for Qwen3-VL, Qwen3.5/3.6, Gemma 4 and Kimi K2.5/2.6); for another "
                'vision-language model set [model] renderer = "chat_template"'
            )
        processor = self.processor
        if isinstance(processor, str):
            from loops_nb.llm.vision import load_processor

            processor = load_processor(processor)
        if processor is None:
            raise UserError(
                f"an image part in the messages, but {self.hub_id or self.name!r} has no image processor"
            )
        self.processor = processor
        build: Callable[..., Any] = type(self.prime)  # the family's class takes the processor it renders with
        self.prime = build(self._named, self.config, processor=processor)
        self._images_ready = True

    def parse(
        self,
        completion_tokens: Sequence[int],
        *,
        prompt_tokens: Sequence[int] | None = None,
        tools: Sequence[ToolSpec] | None = None,
    ) -> ParsedReply:
        # An attempt's next call parses the previous reply again to prove the conversation continues it
        # (breaks.continuation_start): the same tokens, so the same answer, kept for a few calls.
        key = (
            tuple(completion_tokens),
            tuple(prompt_tokens) if prompt_tokens is not None else None,
            json.dumps(tools, sort_keys=True) if tools else None,
        )
        with self._parsed_lock:  # attempts on other threads (the gateway's) share the renderer
            found = self._parsed.pop(key, None)
        if found is None:
            parsed = self.prime.parse_response(
                list(completion_tokens),
                tools=list(tools) if tools else None,
                prompt_ids=list(prompt_tokens) if prompt_tokens is not None else None,
            )
            found = parsed_reply(parsed, self.decode(completion_tokens, skip_special=True))
        with self._parsed_lock:
            self._parsed[key] = found  # most recent last
            while len(self._parsed) > PARSES_KEPT:
                self._parsed.pop(next(iter(self._parsed)))
        return copy.deepcopy(found)

    # -- supervised targets ---------------------------------------------------------------------------------

    def supervised_examples(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None,
        trained_turns: Sequence[int],
        checks: TargetChecks | None = None,
    ) -> SupervisedExamples:
        """The target rule in token ids (docs/reference/renderers.md, "SFT through a family's renderer", which
        says why not `renderers`' own `build_training_sample`)."""
        converted = self._prime_messages(messages)
        turns = {j: self._target_turn(converted, tools, j, checks) for j in trained_turns}
        groups = turn_groups({j: ids for j, (ids, _) in turns.items()})
        examples = []
        for members in groups:
            ids = turns[members[-1]][0]
            reason = checks and checks.context(members[-1], set(members), self.decode(ids))
            if reason:
                raise Refusal(reason)
            examples.append(weighted_example(ids, [(j, turns[j][1], len(turns[j][0])) for j in members]))
        why = split_reason(f"the {self.name} renderer") if len(groups) > 1 else None
        return SupervisedExamples(examples, why)

    def target_stop_tokens(self) -> list[str]:
        return [str(self.tokenizer.convert_ids_to_tokens(i)) for i in self.stop_token_ids]

    def _target_turn(
        self, messages: list[ChatMessage], tools: list[ToolSpec] | None, j: int, checks: TargetChecks | None
    ) -> tuple[list[int], int]:
        """Turn `j` as (its context and own tokens through the stop token, where its own tokens start): what a
        model of the family samples after its generation prompt (SFT trains it; the preflight plays it)."""
        from loops_nb.llm.renderer_choice import reasoning_kept

        opening_turn(j)
        who = f"the {self.name} renderer"
        try:
            context = list(self.prime.render_ids(messages[:j], tools=tools, add_generation_prompt=True))
        except Exception as exc:  # the family's renderer raises whatever its format refuses
            raise render_failed(who, exc, j, f"messages[:{j}] with the generation prompt") from None
        try:
            if self._kept is None:
                kept = reasoning_kept(self.config)
                self._kept = (
                    self
                    if kept == self.config
                    else PrimeRenderer(
                        self.tokenizer, self.name, hub_id=self.hub_id, config=kept, processor=self.processor
                    )
                )
            if self._images_ready and not self._kept._images_ready:
                self._kept._ready_images()
            prime, spec = self._kept.prime, tools or None
            opened = list(prime.render_ids(messages[:j], tools=spec, add_generation_prompt=True))
            written = list(prime.render_ids(messages[: j + 1], tools=spec))
        except Exception as exc:
            raise render_failed(who, exc, j, f"messages[:{j + 1}]") from None
        own = written[len(opened) :]
        if written[: len(opened)] != opened:
            at = next(i for i, (a, b) in enumerate(zip(opened, written, strict=False)) if a != b)
            prompt_text, turn_text = self.decode(opened[at:]), self.decode(written[at:])
            if not turn_text.startswith(prompt_text):
                hint = (
                    ""
                    if messages[j].get("reasoning_content")
                    else "; the prompt opens the turn's reasoning: give the turn a reasoning_content"
                )
                raise TurnNotAfterPrompt(
                    f"messages[{j}]: {who} writes this turn unlike its generation prompt (the prompt has "
                    f"{prompt_text[:40]!r} where the turn has {turn_text[:40]!r}), so the generated tokens "
                    f"cannot be located{hint}"
                )
            own = self.encode(turn_text[len(prompt_text) :])
        stop = next((k for k, t in enumerate(own) if t in self.stop_token_ids), None)
        if stop is None:
            raise Refusal(
                f"messages[{j}]: {who} ends this turn with no stop token (looked for "
                f"{', '.join(self.target_stop_tokens())}); the model could never learn to end it"
            )
        own = own[: stop + 1]
        reason = checks and checks.turn(j, self.decode(own))
        if reason:
            raise Refusal(reason)
        return context + own, len(context)


class TurnNotAfterPrompt(Refusal):
    """An assistant turn the family writes unlike the generation prompt it follows (a gpt-oss prompt opens the
    analysis channel; a turn without reasoning starts in another), so its generated tokens cannot be located."""


def parsed_reply(parsed: ParsedResponse, text: str) -> ParsedReply:
    """`renderers`' parse as the seam's `ParsedReply`: the well-formed calls OpenAI-shaped, the others
    reported with their status and what the model wrote."""
    from renderers import ToolCallParseStatus

    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, call in enumerate(parsed.tool_calls):
        if call.status == ToolCallParseStatus.OK and call.name and isinstance(call.arguments, dict):
            calls.append(tool_call(call.id or f"call_{len(calls)}", call.name, call.arguments))
        else:
            errors.append(
                f"tool call {i}: {_STATUS_TEXT.get(call.status, str(call.status))}: {call.raw[:200]!r}"
            )
    return ParsedReply(
        text=text,
        content=(parsed.content or "").strip(),
        tool_calls=calls,
        tool_call_errors=errors,
        reasoning=(parsed.reasoning_content or "").strip(),
    )


_STATUS_TEXT = {
    "invalid_json": "not valid JSON",
    # "no closing" is what agents (ShellAgent) look for to say the reply was cut at max_tokens.
    "unclosed_block": "no closing tag (cut off?)",
    "missing_name": "no function name",
    "malformed_structure": "malformed call",
    "unknown_tool": "not one of the request's tools",
    "ok": "arguments are not a JSON object",
}


def to_prime_messages(messages: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
    """OpenAI-shaped messages as `renderers` takes them: content a string or parts with each image part
    `{"type": "image", "image": <PIL image>}` (read here: any source `vision.load_image` reads, a bad one a
    one-line error), tool-call arguments an object where they decode to one, and each tool result named
    after its call (gpt-oss writes the name)."""
    from renderers import extract_message_tool_names

    out: list[ChatMessage] = []
    for message in messages:
        msg = dict(message)
        if msg.get("content") is None:
            msg["content"] = ""
        elif isinstance(msg["content"], list):
            msg["content"] = [_loaded(part) for part in msg["content"]]
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_decoded_arguments(c) for c in msg["tool_calls"]]
        out.append(msg)
    for msg, name in zip(out, extract_message_tool_names(out), strict=True):  # type: ignore[arg-type]
        if name and not msg.get("name"):
            msg["name"] = name
    return out


def _decoded_arguments(call: Mapping[str, Any]) -> ToolCall:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError:  # the agent's text: rendered as it is
            decoded = None
        if isinstance(decoded, dict):
            fn["arguments"] = decoded
    return {**call, "function": fn}


def _loaded(part: object) -> object:
    from loops_nb.llm.vision import image_source, load_image

    if not is_image_part(part):
        return part
    return {"type": "image", "image": load_image(image_source(part))}


def message_images(messages: Sequence[Mapping[str, Any]]) -> Iterator[PILImage]:
    """The images of `to_prime_messages`' messages, in the order they are rendered."""
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if isinstance(part, Mapping) and part.get("type") == "image":
                yield part["image"]


def prompt_images(
    rendered: RenderedTokens, messages: Sequence[Mapping[str, Any]], carried: Sequence[PromptImage] = ()
) -> tuple[PromptImage, ...]:
    """The prompt's images: `carried` (earlier turns' images a bridge kept), then each image of `messages`
    at the run of placeholder tokens the family's renderer gave it."""
    from loops_nb.llm.vision import encode_png

    data = rendered.multi_modal_data
    runs = (data.mm_placeholders.get("image", []) if data else [])[len(carried) :]
    images = list(message_images(messages))
    if len(runs) != len(images):
        raise UserError(
            f"the family's renderer placed {len(runs)} image(s) but the messages have {len(images)}"
        )
    new = (PromptImage(run.offset, run.length, encode_png(im)) for run, im in zip(runs, images, strict=True))
    return (*carried, *new)


def carried_images(images: Sequence[PromptImage]) -> MultiModalData:
    """A previous prompt's images as `renderers`' multimodal sidecar: their runs, and one item each (a
    family's renderer counts them to number the next turn's images)."""
    from renderers import MultiModalData, PlaceholderRange

    return MultiModalData(
        mm_placeholders={"image": [PlaceholderRange(im.offset, im.length) for im in images]},
        mm_items={"image": [{"png": im.data} for im in images]},
    )


def renderer_problem(name: str, exc: BaseException) -> str:
    """One line saying why `renderers`' renderer `name` could not be built for this tokenizer, and the fix."""
    from loops_nb.missing_package import install_line, missing_package

    package = missing_package(exc)
    if package is not None:
        return install_line(f"[model] renderer {name!r}", package)
    text = " ".join(str(exc).split())
    if "vocab" in text and name == "gpt-oss":
        return (
            f"[model] renderer {name!r}: openai-harmony could not load its o200k_base vocabulary ({text[:200]}); "
            "offline, set TIKTOKEN_ENCODINGS_BASE to a folder holding o200k_base.tiktoken"
        )
    return (
        f"[model] renderer {name!r} does not fit this model's tokenizer ({type(exc).__name__}: {text[:200]}); "
        'set [model] renderer to the family\'s renderer, or "chat_template"'
    )
