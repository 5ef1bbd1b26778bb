"""The target rule on real chat templates: what trains, in which context, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest
from sft_fixtures import LLAMA3_TEMPLATE, build_tokenizer

from loops_nb.errors import ConfigError
from loops_nb.llm.templates import parse_tool_calls
from loops_nb.sft.data import ChatRow, RefusedRow, parse_row
from loops_nb.sft.targets import Example, RenderedRow, chat_targets

USER = {"role": "user", "content": "What is the capital of France?"}
PARIS = {"role": "assistant", "content": "Paris."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_ROW = {
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny", "temp": 22}'},
        {"role": "assistant", "content": "It is sunny, 22 degrees."},
    ],
}


def render(tok: Any, row: dict, **kwargs: Any) -> RenderedRow | RefusedRow:
    parsed = parse_row(row, 1)
    assert not isinstance(parsed, RefusedRow), parsed
    return chat_targets(tok, **kwargs).render(parsed)


def rendered(tok: Any, row: dict, **kwargs: Any) -> RenderedRow:
    result = render(tok, row, **kwargs)
    assert isinstance(result, RenderedRow), result
    return result


def trained(tok: Any, example: Example) -> dict[int, str]:
    """Decoded trained text per turn."""
    out: dict[int, str] = {}
    for seg in example.segments(tok):
        if seg.trained:
            out[seg.turn] = out.get(seg.turn, "") + seg.text
    return out


def hf_ids(tok: Any, row: dict, upto: int, *, prompt: bool) -> list[int]:
    """The reference: transformers' own apply_chat_template, tokenized."""
    parsed = parse_row(row)
    assert isinstance(parsed, ChatRow)
    return tok.apply_chat_template(
        parsed.template_messages()[:upto],
        tools=parsed.template_tools(),
        add_generation_prompt=prompt,
        tokenize=True,
        return_dict=False,
    )


def assert_generation_contexts(tok: Any, row: dict, result: RenderedRow, *, whole: bool = True) -> None:
    """Every trained turn sits after exactly the tokens the model was prompted with when it generated it, and
    (``whole``) its tokens are those of the template's render of the conversation up to that turn."""
    for example in result.examples:
        for j in example.turn_indices:
            first = example.token_turns.index(j)
            assert example.input_ids[:first] == hf_ids(tok, row, j, prompt=True), f"context of messages[{j}]"
            if whole:
                last = len(example.token_turns) - example.token_turns[::-1].index(j)
                assert example.input_ids[:last] == hf_ids(tok, row, j + 1, prompt=False)[:last]


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("smollm2", "Paris.<|im_end|>"),
        ("smollm2_tools", "Paris.<|im_end|>"),
        ("llama3", "Paris.<|eot_id|>"),
        (
            "qwen3",
            "<think>\n\n</think>\n\nParis.<|im_end|>",
        ),  # Qwen3 writes an empty think block on the last turn
    ],
)
def test_answer_and_its_stop_token_train(make_tokenizer: Any, family: str, expected: str) -> None:
    tok = make_tokenizer(family)
    row = {"messages": [USER, PARIS]}
    result = rendered(tok, row)
    [example] = result.examples
    assert trained(tok, example) == {1: expected}
    assert result.split_reason is None
    # The example is the template's render, ending at the stop token: what follows it ("\n") never trains.
    full = tok.apply_chat_template([USER, PARIS], tokenize=False)
    assert tok.decode(example.input_ids) == full[: full.rindex(expected) + len(expected)]
    assert example.weights[-1] == 1.0 and example.input_ids[-1] == tok.convert_tokens_to_ids(expected[-10:])
    assert_generation_contexts(tok, row, result)


def test_weights_pick_turns_and_between_turn_tokens_do_not_train(smollm2: Any) -> None:
    row = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "weight": 0},
            USER,
            {**PARIS, "weight": 1},
            {"role": "user", "content": "And of Spain?"},
            {"role": "assistant", "content": "Madrid."},
            {"role": "user", "content": "Thanks"},  # trailing turns after the last trained one are cut
        ]
    }
    [example] = rendered(smollm2, row).examples
    assert example.turn_indices == (3, 5)
    assert trained(smollm2, example) == {3: "Paris.<|im_end|>", 5: "Madrid.<|im_end|>"}
    end3 = len(example.token_turns) - example.token_turns[::-1].index(3)
    assert smollm2.decode(example.input_ids[end3 : end3 + 3]) == "\n<|im_start|>user"
    assert example.weights[end3] == 0.0
    assert smollm2.decode(example.input_ids).endswith("Madrid.<|im_end|>")
    assert example.n_trained == sum(1 for t in example.token_turns if t >= 0)
    assert_generation_contexts(smollm2, row, RenderedRow(1, [example]))


def test_llama3_multi_turn_is_one_example(llama3: Any) -> None:
    row = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            USER,
            PARIS,
            USER,
            {**PARIS, "content": " Paris. "},
        ]
    }
    result = rendered(llama3, row)
    [example] = result.examples
    # Llama 3's template trims content; the survival check compares stripped text.
    assert trained(llama3, example) == {2: "Paris.<|eot_id|>", 4: "Paris.<|eot_id|>"}
    assert llama3.decode(example.input_ids[:1]) == "<|begin_of_text|>" and example.weights[0] == 0.0
    assert_generation_contexts(llama3, row, result)


def test_qwen3_splits_turns_whose_context_the_template_rewrites(qwen3: Any) -> None:
    row = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
            USER,
            {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis."},
        ]
    }
    result = rendered(qwen3, row)
    assert [e.turn_indices for e in result.examples] == [(1,), (3,)]
    assert "renders earlier turns differently" in result.split_reason
    assert all(e.split_reason == result.split_reason for e in result.examples)
    first, second = result.examples
    assert trained(qwen3, first) == {1: "<think>\nA greeting.\n</think>\n\nHello!<|im_end|>"}
    assert trained(qwen3, second) == {3: "<think>\nEasy.\n</think>\n\nParis.<|im_end|>"}
    # In the second example the first answer is context, as the template renders it then: reasoning dropped.
    assert "A greeting" not in qwen3.decode(second.input_ids)
    assert "<|im_start|>assistant\nHello!<|im_end|>" in qwen3.decode(second.input_ids)
    assert_generation_contexts(qwen3, row, result)


def test_qwen3_multi_step_tool_calls_with_reasoning_stay_one_example(qwen3: Any) -> None:
    row = {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "reasoning_content": "I should call the tool.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "reasoning_content": "It said sunny.", "content": "It is sunny."},
        ],
    }
    result = rendered(qwen3, row)
    [example] = result.examples
    turns = trained(qwen3, example)
    assert turns[1] == (
        '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    assert turns[3] == "<think>\nIt said sunny.\n</think>\n\nIt is sunny.<|im_end|>"
    assert_generation_contexts(qwen3, row, result)


def test_qwen3_tool_turn_without_reasoning_is_split(qwen3: Any) -> None:
    # The tool-call turn was generated with an empty <think> block that later renders drop.
    result = rendered(qwen3, TOOL_ROW)
    assert [e.turn_indices for e in result.examples] == [(1,), (3,)]
    assert_generation_contexts(qwen3, TOOL_ROW, result)


def test_smollm2_template_drops_tool_calls_and_the_row_is_refused(smollm2: Any) -> None:
    result = render(smollm2, TOOL_ROW)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith("messages[1].tool_calls[0]: the chat template dropped this tool call")
    assert "set [model] chat_template to a tool-capable template" in result.reason


def test_smollm2_template_drops_tool_definitions(smollm2: Any) -> None:
    row = {"tools": TOOLS, "messages": [USER, PARIS]}
    result = render(smollm2, row)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith("tools[0]: the chat template dropped this tool definition ('get_weather'")


def test_llama3_template_drops_tool_calls(llama3: Any) -> None:
    result = render(llama3, TOOL_ROW)
    assert isinstance(result, RefusedRow)
    assert "messages[1].tool_calls[0]: the chat template dropped this tool call" in result.reason


def test_tool_capable_template_keeps_tool_calls(smollm2_tools: Any) -> None:
    result = rendered(smollm2_tools, TOOL_ROW)
    [example] = result.examples
    turns = trained(smollm2_tools, example)
    assert turns[1] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    assert parse_tool_calls(turns[1]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert turns[3] == "It is sunny, 22 degrees.<|im_end|>"
    text = smollm2_tools.decode(example.input_ids)
    assert (
        '<|im_start|>tool\n<tool_response>\n{"sky": "sunny", "temp": 22}\n</tool_response><|im_end|>' in text
    )
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert_generation_contexts(smollm2_tools, TOOL_ROW, result)


def test_same_template_via_override(smollm2: Any) -> None:
    from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE

    result = render(smollm2, TOOL_ROW, chat_template=TOOL_CAPABLE_CHATML_TEMPLATE)
    assert isinstance(result, RenderedRow)


def test_tokenization_that_differs_at_a_boundary_splits_the_turn(make_tokenizer: Any) -> None:
    # Llama 3's template on a GPT-2-regex tokenizer: "\n\n" at the end of the prompt is one token, but inside
    # the conversation it is two, so the turn is trained on exactly the prompt's tokens, as its own example.
    tok = make_tokenizer("llama3", regex=None)
    row = {"messages": [USER, PARIS, USER, PARIS]}
    result = rendered(tok, row)
    assert [e.turn_indices for e in result.examples] == [(1,), (3,)]
    assert "tokenizes differently" in result.split_reason
    assert_generation_contexts(tok, row, result, whole=False)
    assert trained(tok, result.examples[1]) == {3: "Paris.<|eot_id|>"}


def test_tokenized_rows_pass_through(smollm2: Any) -> None:
    row = parse_row({"input_ids": [1, 5, 6, 2], "weights": [0, 1, 0.5, 1]}, 4)
    result = chat_targets(smollm2).render(row)
    assert isinstance(result, RenderedRow)
    [example] = result.examples
    assert (example.input_ids, example.weights, example.row_number) == ([1, 5, 6, 2], [0.0, 1.0, 0.5, 1.0], 4)
    assert example.n_trained == 3


def test_tokenized_rows_are_checked_against_vocab_and_length(smollm2: Any) -> None:
    big = parse_row({"input_ids": [1, len(smollm2) + 3], "weights": [1, 1]}, 2)
    result = chat_targets(smollm2).render(big)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith(f"input_ids[1]: token id {len(smollm2) + 3} is outside the tokenizer's")
    long = parse_row({"input_ids": [1] * 10, "weights": [1] * 10}, 3)
    result = chat_targets(smollm2, max_seq_len=8).render(long)
    assert isinstance(result, RefusedRow) and result.row_number == 3
    assert result.reason.startswith("the row is 10 tokens, longer than max_seq_len 8")


def test_too_long_conversations_are_refused_not_truncated(smollm2: Any, qwen3: Any) -> None:
    n = rendered(smollm2, {"messages": [USER, PARIS]}).examples[0].n_tokens
    assert isinstance(render(smollm2, {"messages": [USER, PARIS]}, max_seq_len=n), RenderedRow)
    result = render(smollm2, {"messages": [USER, PARIS]}, max_seq_len=n - 1)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith(f"the conversation is {n} tokens, longer than max_seq_len {n - 1}")
    row = {"messages": [USER, {"role": "assistant", "content": "<think>x</think>Paris."}, USER, PARIS]}
    lengths = [e.n_tokens for e in rendered(qwen3, row).examples]
    result = render(qwen3, row, max_seq_len=max(lengths) - 1)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith("the example ending at messages[3] is")


def test_special_tokens_in_text_are_refused(smollm2: Any) -> None:
    row = {"messages": [USER, {"role": "assistant", "content": "Paris.<|im_end|> more"}]}
    result = render(smollm2, row)
    assert isinstance(result, RefusedRow)
    assert result.reason == (
        "messages[1].content: contains the special token '<|im_end|>', which the tokenizer would read as a "
        "control token, not text"
    )


CHATML_GEN = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (
            "{{ raise_exception('Conversation roles must alternate') }}",
            "messages[1]: the chat template failed to render messages[:1] with the generation prompt: "
            "Conversation roles must alternate",
        ),
        (  # DeepSeek-R1 style: the prompt opens a <think> that rendered turns don't have
            CHATML_GEN + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}",
            "messages[1]: the chat template's generation prompt does not match how it renders the turn",
        ),
        (
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
            "messages[1]: the rendered turn has no stop token (looked for <|im_end|>)",
        ),
        (
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] if m['role'] != "
            "'assistant' else 'OK') + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
            "messages[1].content: the chat template dropped this text (it is not in the rendered turn)",
        ),
    ],
    ids=["raises", "prompt-mismatch", "no-stop-token", "drops-content"],
)
def test_template_problems_are_refused_with_the_reason(smollm2: Any, template: str, reason: str) -> None:
    result = render(smollm2, {"messages": [USER, PARIS]}, chat_template=template)
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith(reason), result.reason


def test_stop_tokens_must_be_added_tokens(smollm2: Any) -> None:
    with pytest.raises(ConfigError, match="stop token 'STOP' is not a special/added token"):
        chat_targets(smollm2, stop_tokens=["STOP"])
    assert chat_targets(smollm2).stop_tokens == ["<|im_end|>"]


def test_a_known_end_token_the_template_never_writes_is_no_stop() -> None:
    """Gemma's vocabulary holds `</s>`, but its template ends turns with `<end_of_turn>`: as a stop, `</s>`
    would refuse an answer that writes an HTML strikethrough."""
    tokenizer = build_tokenizer("smollm2")
    tokenizer.add_tokens(["</s>"])
    renderer = chat_targets(tokenizer)
    assert renderer.stop_tokens == ["<|im_end|>"]
    html = {"role": "assistant", "content": "Write <s>old</s> for struck-through text."}
    result = renderer.render(parse_row({"messages": [USER, html]}, 1))
    assert isinstance(result, RenderedRow), result
    [example] = result.examples
    trained = [t for t, w in zip(example.input_ids, example.weights, strict=True) if w]
    assert "<s>old</s>" in tokenizer.decode(trained)


def test_segments_show_what_trains(smollm2: Any) -> None:
    [example] = rendered(smollm2, {"messages": [USER, PARIS]}).examples
    segments = example.segments(smollm2)
    assert "".join(s.text for s in segments) == smollm2.decode(example.input_ids)
    assert [(s.text, s.turn) for s in segments if s.trained] == [("Paris.<|im_end|>", 1)]
    assert segments[-2].text.endswith("<|im_start|>assistant\n") and not segments[-2].trained


def test_llama3_template_literal_is_verbatim() -> None:
    assert "message['content'] | trim" in LLAMA3_TEMPLATE


def test_long_conversations_tokenize_in_linear_time(
    smollm2_tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 trained turns tokenize the conversation once plus a short piece per turn, not every prefix again:
    the characters handed to the tokenizer are counted, not timed."""
    messages: list[dict] = []
    for i in range(60):
        messages += [
            {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": f"Answer {i}."},
        ]
    targets = chat_targets(smollm2_tools)
    renderer = targets.renderer.targets()
    row = parse_row({"messages": messages}, 1)
    tokenized: list[int] = []
    encode, encode_many = renderer._encoder.encode, renderer._encode_many

    def counting_encode(text: str):
        tokenized.append(len(text))
        return encode(text)

    def counting_encode_many(texts: list[str]):
        tokenized.extend(len(t) for t in texts)
        return encode_many(texts)

    monkeypatch.setattr(renderer._encoder, "encode", counting_encode)
    monkeypatch.setattr(renderer, "_encode_many", counting_encode_many)
    result = targets.render(row)
    assert isinstance(result, RenderedRow) and len(result.examples) == 1
    assert result.examples[0].turn_indices == tuple(range(1, 120, 2))
    conversation = len(renderer.template.render(messages, None, add_generation_prompt=False))
    # Every prefix again would be about 30x the conversation; once plus the pieces is under 2x.
    assert sum(tokenized) < 2 * conversation, (sum(tokenized), conversation)


def test_template_variables_reach_the_template(qwen3: Any) -> None:
    # With enable_thinking=False, Qwen3's prompt carries the empty think block, so it is context, not target.
    result = rendered(qwen3, {"messages": [USER, PARIS]}, template_variables={"enable_thinking": False})
    assert trained(qwen3, result.examples[0]) == {1: "Paris.<|im_end|>"}


def test_a_trained_opening_assistant_turn_is_refused(smollm2: Any) -> None:
    result = render(smollm2, {"messages": [PARIS, USER, PARIS]})
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith("messages[0]: a trained assistant turn cannot open the conversation")
    ok = rendered(smollm2, {"messages": [{**PARIS, "weight": 0}, USER, PARIS]})
    assert ok.examples[0].turn_indices == (2,)


def test_public_apply_chat_template_path_gives_the_same_examples(
    qwen3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loops_nb.llm.templates import ChatTemplate

    row = {"messages": [USER, {"role": "assistant", "content": "<think>x</think>Paris."}, USER, PARIS]}
    fast = rendered(qwen3, row)
    monkeypatch.setattr(ChatTemplate, "_compiled_for", lambda self, tools: False)
    slow = rendered(qwen3, row)
    assert [e.input_ids for e in slow.examples] == [e.input_ids for e in fast.examples]
    assert [e.weights for e in slow.examples] == [e.weights for e in fast.examples]
