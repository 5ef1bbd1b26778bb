"""Sequence breaks by cause: the chat template on the tiny SmolLM2-style tokenizer (its own template and
`chatml-tools`) and `PrimeRenderer` on Qwen3's real vocabulary say why a turn's prompt did not extend the
previous call's tokens, keep the first tokens that differ, and steps.jsonl counts them by cause."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from family_replies import FAMILY_REPLIES, TOOLS
from scripted_policy import ScriptedPolicy
from sft_fixtures import build_tokenizer
from test_prime_renderer import call_of, family_renderer

from loops_nb.llm.breaks import (
    CAUSES,
    HISTORY_EDITED,
    REASONING_DROPPED,
    TEMPLATE_REWROTE_HISTORY,
    TOOL_CALL_RERENDERED,
    TRUNCATION,
    classify_break,
)
from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.llm.client import LoopsLLM
from loops_nb.llm.renderer import ChatRenderer, Renderer

USER = [{"role": "user", "content": "What is 2 + 2?"}]


async def two_turns(
    renderer: Renderer, replies: list[str], then: Callable[[list[dict[str, Any]], Any], list[dict[str, Any]]]
) -> TokenCapture:
    """A first call on USER, then a second on `then(messages, first reply)`, through `LoopsLLM`."""
    llm = LoopsLLM(renderer, ScriptedPolicy(renderer, replies), TokenCapture())
    first = await llm.chat(USER, tools=TOOLS)
    await llm.chat(then(list(USER), first), tools=TOOLS)
    return llm.capture


def followed_by_user(messages: list[dict[str, Any]], reply: Any) -> list[dict[str, Any]]:
    return [*messages, reply.message, {"role": "user", "content": "And 3 + 3?"}]


def followed_by_tool(messages: list[dict[str, Any]], reply: Any) -> list[dict[str, Any]]:
    return [*messages, reply.message, {"role": "tool", "tool_call_id": "call_0", "content": "4"}]


async def test_the_chat_template_that_extends_has_no_break() -> None:
    capture = await two_turns(ChatRenderer(build_tokenizer("smollm2")), ["It is 4.", "6."], followed_by_user)
    assert not capture.breaks and capture.break_records() == []
    assert len(capture.sequences()) == 1


async def test_smollm2s_template_drops_the_reasoning_it_never_renders() -> None:
    renderer = ChatRenderer(build_tokenizer("smollm2"))
    capture = await two_turns(renderer, ["<think>\nadd them\n</think>\n\nIt is 4.", "6."], followed_by_user)
    assert capture.breaks == {REASONING_DROPPED: 1}
    [record] = capture.break_records()
    assert record["call"] == 1 and record["cause"] == REASONING_DROPPED
    # The first differing tokens, decoded: the sampled think block against the rendered answer.
    assert record["first_difference"].startswith("at token ")
    assert "<think>" in record["first_difference"].split(", now ")[0]
    assert len(capture.sequences()) == 2


async def test_a_tool_call_the_template_writes_otherwise_is_rerendered() -> None:
    renderer = ChatRenderer(build_tokenizer("smollm2_tools"))
    compact = '<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call>'
    capture = await two_turns(renderer, [compact, "Sunny."], followed_by_tool)
    assert capture.breaks == {TOOL_CALL_RERENDERED: 1}
    spaced = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert not (await two_turns(renderer, [spaced, "Sunny."], followed_by_tool)).breaks


async def test_an_agent_that_edits_its_history_or_truncates_is_told_apart() -> None:
    renderer = ChatRenderer(build_tokenizer("smollm2"))

    def edited(messages: list[dict[str, Any]], reply: Any) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "Be brief."}, *followed_by_user(messages, reply)]

    assert (await two_turns(renderer, ["It is 4.", "6."], edited)).breaks == {HISTORY_EDITED: 1}
    prompt = renderer.prompt_tokens(USER)
    sampled = renderer.encode("It is")
    cut = ModelCall(prompt, sampled, [-0.1] * len(sampled), 0, "length", messages=list(USER))
    messages = [*USER, {"role": "assistant", "content": "It is"}, {"role": "user", "content": "Go on."}]
    later = renderer.prompt_tokens(messages)
    assert classify_break(renderer, messages, None, cut, later).cause == TRUNCATION


async def test_a_template_that_rewrites_the_system_prompt_rewrites_history() -> None:
    counting = (
        "<|im_start|>system\n{{ messages|length }} messages<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    renderer = ChatRenderer(build_tokenizer("smollm2"), counting)
    capture = await two_turns(renderer, ["It is 4.<|im_end|>", "6."], followed_by_user)
    assert capture.breaks == {TEMPLATE_REWROTE_HISTORY: 1}
    assert "'1 messages" in capture.break_records()[0]["first_difference"]


def test_a_withdrawn_call_keeps_the_causes_of_the_breaks_that_remain() -> None:
    def call(prompt: list[int], completion: list[int]) -> ModelCall:
        return ModelCall(prompt, completion, [-0.1] * len(completion), 0, "stop")

    capture = TokenCapture()
    first, second, third = call([1], [2]), call([1, 2, 3], [4]), call([9], [5])
    capture.record(first)
    capture.record(second)
    capture.record(third)  # unexplained: counted as the template's, its first difference as token ids
    assert capture.break_records() == [
        {
            "call": 2,
            "cause": TEMPLATE_REWROTE_HISTORY,
            "first_difference": "at token 0: was '[1, 2, 3, 4]', now '[9]'",
        }
    ]
    capture.withdraw(second)
    assert capture.breaks == {TEMPLATE_REWROTE_HISTORY: 1} and len(capture.calls) == 2


def test_prime_renderer_breaks_are_reasoning_dropped_or_history_edited(
    family_tokenizer: Callable[[str], Any],
) -> None:
    """Qwen3 drops earlier reasoning at a new user message, so its bridge refuses; an edited system prompt
    is another conversation."""
    renderer, replies = family_renderer("qwen3", family_tokenizer), FAMILY_REPLIES["qwen3"]
    conversation = [{"role": "user", "content": "What is the weather in Rome?"}]
    prompt = renderer.prompt_tokens(conversation, TOOLS)
    answer = ModelCall(
        **{**call_of(renderer, prompt, replies.answer_reply).__dict__, "messages": conversation}
    )
    reply = renderer.parse(answer.completion_tokens, prompt_tokens=prompt, tools=TOOLS)
    assert reply.reasoning == "The tool answered."
    sent_back = {"role": "assistant", "content": reply.content, "reasoning_content": reply.reasoning}
    follow = [*conversation, sent_back, {"role": "user", "content": "And in Oslo?"}]
    later = renderer.prompt_tokens(follow, TOOLS, answer)
    found = classify_break(renderer, follow, TOOLS, answer, later)
    assert found.cause == REASONING_DROPPED, found
    assert "<think>" in found.first_difference.split(", now ")[0]
    edited = [{"role": "system", "content": "Be brief."}, *follow]
    fresh = renderer.prompt_tokens(edited, TOOLS, answer)
    assert classify_break(renderer, edited, TOOLS, answer, fresh).cause == HISTORY_EDITED


def test_steps_count_breaks_by_cause() -> None:
    from collections import Counter

    from loops_nb.rl.step_log import StepTraining, step_metrics

    class Attempt:
        def __init__(self, causes: list[str]) -> None:
            self.capture = TokenCapture()
            self.capture.calls = [ModelCall([i], [i], [0.0], 0, "stop") for i in range(len(causes) + 1)]
            self.capture.breaks_at = [None] + [_break(c) for c in causes]
            self.evidence = type("E", (), {"discarded": None})()

    class Scheduler:
        stats = type("S", (), {"stale_requeued": 0})()

    attempts = [Attempt([REASONING_DROPPED, HISTORY_EDITED]), Attempt([REASONING_DROPPED])]
    metrics = step_metrics(1, attempts, StepTraining([], {}, {}), Scheduler(), 0)  # type: ignore[arg-type]
    assert metrics["sequences/breaks"] == 3
    by_cause = {c: metrics[f"sequences/breaks/{c}"] for c in CAUSES}
    assert by_cause == {**dict.fromkeys(CAUSES, 0), REASONING_DROPPED: 2, HISTORY_EDITED: 1}
    assert sum(Counter(by_cause).values()) == metrics["sequences/breaks"]


def _break(cause: str) -> Any:
    from loops_nb.llm.breaks import SequenceBreak

    return SequenceBreak(cause, "at token 0: was '', now ''")
