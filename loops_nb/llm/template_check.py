"""`loops check`'s template preflight: an attempt's turns played through the configured renderer on a sample
tool conversation, counting its sequence breaks by cause and whether the tool call parses back as written
(docs/reference/renderers.md, "Which renderer").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loops_nb.llm.breaks import classify_break
from loops_nb.llm.capture import ModelCall
from loops_nb.llm.chat_messages import ChatMessage, ToolCall, assistant_message
from loops_nb.llm.renderer import CHAT_TEMPLATE, call_keys

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer

SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
}
SAMPLE_TURNS: list[ChatMessage] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [_CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny in Rome, 21 C."},
    {"role": "user", "content": "And tomorrow?"},
]
"""The sample attempt: two sampled assistant turns, each followed by what the agent sends next."""
_TAIL = 40
"""Characters of the prompt's end that find where a rewritten rendering's reply starts."""
SAMPLE_REASONING = {2: "The user asks about the weather.", 4: "The tool answered."}
"""What each sampled turn reasons where the prompt opens a reasoning block (each its own, so a dropped one is
told from a kept one)."""


@dataclass
class TemplateCheck:
    """What the sample attempt showed."""

    calls: int = 0
    breaks: Counter[str] = field(default_factory=Counter)
    first_difference: str = ""
    """Where the first break's prompt left the previous tokens, decoded."""
    tool_call: str = "ok"
    """`ok`, or what went wrong with the call written and parsed back."""
    unknown: int | None = None
    """The sample turn whose reply the rendering cannot tell (the check stopped there)."""
    family_drop: bool = False
    """The last break is a family's renderer dropping earlier reasoning at the new user message, as the family's
    own template does (Qwen3, gpt-oss): said, not warned, since keeping it would show the model a history its
    template never shows it."""

    def line(self, renderer: Renderer) -> str:
        breaks = sum(self.breaks.values())
        if self.unknown is not None:
            return (
                f"template: {renderer.name} on a sample tool conversation: turn {self.unknown} is written unlike "
                f"the generation prompt it follows, so its reply cannot be told from the rendering; {breaks} "
                "break(s) before it (not checked further)"
            )
        causes = ", ".join(f"{n} {cause}" for cause, n in sorted(self.breaks.items()))
        if self.family_drop:
            causes += "; reasoning dropped at the new user message, as the family's own template drops it"
        # Not a warning: a task without tools (the quickstarts on SmolLM2's own template) needs none.
        tools = "ok" if self.tool_call == "ok" else f"fails, {self.tool_call}; for tools, {_fix(renderer)}"
        return (
            f"template: {renderer.name} on a sample tool conversation: {self.calls} model calls, {breaks} "
            f"sequence break(s) per attempt{f' ({causes})' if causes else ''}; tool call round trip {tools}"
        )

    def warnings(self, renderer: Renderer) -> list[str]:
        """A break costs every multi-turn attempt context and training signal, tools or not."""
        if sum(self.breaks.values()) <= int(self.family_drop):
            return []
        return [
            f"template: each attempt like the sample breaks into {sum(self.breaks.values()) + 1} training "
            f"sequences ({', '.join(sorted(self.breaks))}; first difference {self.first_difference}), so every "
            f"later turn re-reads the conversation: {_fix(renderer)}"
        ]


def check_template(renderer: Renderer) -> TemplateCheck:
    """Play the sample attempt through `renderer` (see the module docstring)."""
    found = TemplateCheck()
    conversation = SAMPLE_TURNS[:2]
    previous: ModelCall | None = None
    for turn in (2, 4, len(SAMPLE_TURNS)):  # the last: the prompt after the new user message
        last = turn == len(SAMPLE_TURNS)
        prompt, _ = renderer.render_prompt(conversation, SAMPLE_TOOLS, previous)
        sent = previous.prompt_tokens + previous.completion_tokens if previous is not None else []
        if previous is not None and prompt[: len(sent)] != sent:
            cut = classify_break(renderer, conversation, SAMPLE_TOOLS, previous, prompt)
            found.breaks[cut.cause] += 1
            found.family_drop = last and cut.cause == "reasoning_dropped" and renderer.name != CHAT_TEMPLATE
            if not found.family_drop:
                found.first_difference = found.first_difference or cut.first_difference
        if last:
            break
        target, after = SAMPLE_TURNS[turn], SAMPLE_TURNS[turn + 1]
        completion = _written_reply(renderer, conversation, target, after, prompt, SAMPLE_REASONING[turn])
        if completion is None:
            found.unknown = turn
            return found
        call = ModelCall(prompt, completion, [0.0] * len(completion), 0, "stop", messages=list(conversation))
        found.calls += 1
        reply = renderer.parse(completion, prompt_tokens=prompt, tools=SAMPLE_TOOLS)
        if turn == 2:
            found.tool_call = _round_trip(target, reply.tool_calls, reply.tool_call_errors)
        # Sent back as `Reply.message` is: content, calls, reasoning.
        sent_back = assistant_message(reply.content, reply.tool_calls, reply.reasoning)
        conversation = [*conversation, sent_back, after]
        previous = call
    return found


def _written_reply(
    renderer: Renderer,
    conversation: list[ChatMessage],
    target: ChatMessage,
    after: ChatMessage,
    prompt: list[int],
    reasoning: str,
) -> list[int] | None:
    """The reply as the renderer writes `target`, through its stop token: for a family's renderer, the turn's
    training target; for a chat template, the tokens after the prompt in a fresh rendering of the conversation
    with it. A prompt that opens a reasoning block (Qwen3.6, gpt-oss) is answered with reasoning, as such a
    model writes it. None where the reply cannot be told from the rendering."""
    from loops_nb.llm.prime_renderer import PrimeRenderer, TurnNotAfterPrompt

    if isinstance(renderer, PrimeRenderer):
        # With reasoning, as a reasoning model answers (a family that writes none renders the same tokens).
        turn = {**target, "reasoning_content": reasoning}
        try:
            found = renderer.supervised_examples([*conversation, turn], SAMPLE_TOOLS, [len(conversation)])
        except TurnNotAfterPrompt:
            return None
        return [t for t, w in zip(found.examples[0].input_ids, found.examples[0].weights, strict=True) if w]
    # Against the prompt rendered afresh: the bridged one ends in the same generation prompt.
    base = renderer.prompt_tokens(conversation, SAMPLE_TOOLS)
    for turn in (target, {**target, "reasoning_content": reasoning}):
        fresh = renderer.prompt_tokens([*conversation, turn, after], SAMPLE_TOOLS)
        if fresh[: len(base)] == base:
            return _through_stop(renderer, fresh[len(base) :])
        # The same text split otherwise at the boundary ("<think>\n" + "\n" vs "<think>\n\n"): the model
        # samples the reply's text after the prompt's.
        text, before = renderer.decode(fresh), renderer.decode(base)
        if text.startswith(before):
            return _through_stop(renderer, renderer.encode(text[len(before) :]))
        # A chat template that rewrote the history before it: the reply follows the prompt's tail (the last
        # message's end and the generation prompt) where the rendering first has it. Not for a family's
        # renderer: a reasoning channel (gpt-oss) would be read as the reply.
        at = text.find(before[-_TAIL:]) if renderer.extends_by_text else -1
        if at >= 0:
            return _through_stop(renderer, renderer.encode(text[at + len(before[-_TAIL:]) :]))
    return None


def _through_stop(renderer: Renderer, tokens: list[int]) -> list[int]:
    stop = next((i for i, t in enumerate(tokens) if t in renderer.stop_token_ids), len(tokens) - 1)
    return tokens[: stop + 1]


def _round_trip(target: ChatMessage, calls: list[ToolCall], errors: list[str]) -> str:
    if call_keys(calls) == call_keys(target["tool_calls"]):
        return "ok"
    if errors:
        return f"it parses as an error: {errors[0][:120]}"
    if not calls:
        return "the rendered call parses back as no call (the template may drop tool calls)"
    return f"it parses back as {call_keys(calls)!r}"


def _fix(renderer: Renderer) -> str:
    if renderer.name == CHAT_TEMPLATE:
        return (
            "set [model] renderer to the model family's renderer, or [model] chat_template_file to a template "
            'that keeps its turns and writes tool calls (chat_template = "chatml-tools" for ChatML models)'
        )
    return (
        'set [model] renderer to another family\'s renderer that fits this model, or "chat_template" with '
        "[model] chat_template_file"
    )


def template_report(renderer: Renderer) -> tuple[str, list[str]]:
    """`loops check`'s `template:` line and its warnings for `renderer`."""
    try:
        found = check_template(renderer)
    except Exception as exc:  # a template that raises on tools or tool turns: what an attempt would hit
        text = " ".join(str(exc).split())[:200]
        return (
            f"template: {renderer.name} cannot render the sample tool conversation",
            [
                f"template: rendering a tool conversation failed ({type(exc).__name__}: {text}): {_fix(renderer)}"
            ],
        )
    return found.line(renderer), found.warnings(renderer)
