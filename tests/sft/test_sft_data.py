"""Data contracts: every refusal reason names the row and the field, and reading streams."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from sft_fixtures import write_jsonl

from loops_nb.errors import DataError
from loops_nb.sft.data import ChatRow, RefusedRow, TokenizedRow, iter_rows, parse_row, read_rows

USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris."}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def call(name: str = "get_weather", args: object = '{"city": "Paris"}', id: str = "c1") -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def test_chat_row_parses_with_defaults() -> None:
    row = parse_row({"messages": [USER, ANSWER]}, 7)
    assert isinstance(row, ChatRow)
    assert row.row_number == 7
    assert row.trained_turns == [1]  # no weight: every assistant turn trains


def test_weights_choose_trained_turns() -> None:
    row = parse_row({"messages": [USER, {**ANSWER, "weight": 0}, USER, {**ANSWER, "weight": 1}]})
    assert isinstance(row, ChatRow)
    assert row.trained_turns == [3]


def test_text_parts_are_joined_and_arguments_parsed() -> None:
    row = parse_row(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "?"}],
                },
                {"role": "assistant", "tool_calls": [call(args='{"city": "Paris"}')]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]},
            ],
            "tools": TOOLS,
        }
    )
    assert isinstance(row, ChatRow)
    assert row.messages[0].content == "Weather ?"
    assert row.messages[1].tool_calls[0].function.arguments == {"city": "Paris"}
    msgs = row.template_messages()
    assert msgs[1]["content"] == ""  # templates get "", not None, for a tool-call-only turn
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_tokenized_row_parses() -> None:
    row = parse_row({"input_ids": [1, 2, 3], "weights": [0, 1, 0.5]}, 2)
    assert isinstance(row, TokenizedRow)
    assert row.weights == [0.0, 1.0, 0.5]
    assert row.row_number == 2


REFUSALS = [
    ("[1, 2]", "a row must be a JSON object"),
    ('{"foo": 1}', "neither messages (chat) nor input_ids"),
    (
        {"messages": [USER, ANSWER], "input_ids": [1], "weights": [1]},
        "mixes the chat format (messages) with the tokenized format (input_ids, weights)",
    ),
    ({"messages": []}, "messages: empty"),
    ({"messages": "hi"}, "messages: must be a list"),
    (
        {"messages": [{"role": "developer", "content": "x"}, ANSWER]},
        "messages[0].role: unknown role 'developer'",
    ),
    (
        {"messages": [USER, {"role": "assistant"}]},
        "messages[1]: empty assistant turn (no content and no tool_calls)",
    ),
    ({"messages": [USER, {"role": "assistant", "content": ""}]}, "messages[1]: empty assistant turn"),
    (
        {"messages": [USER, {**ANSWER, "content": 5}]},
        "messages[1].content: must be a string, got the number 5",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, ANSWER]},
        "messages[0].content: part 0: an image part needs its URL, data URL or path as a string",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, ANSWER]},
        "messages[0].content: part 0 is 'input_audio'; only text and image parts",
    ),
    (
        {
            "messages": [
                USER,
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]},
            ]
        },
        "messages[1].content: only user turns hold images",
    ),
    ({"messages": [{**USER, "weight": 1}, ANSWER]}, "messages[0].weight: only assistant turns take a weight"),
    ({"messages": [USER, {**ANSWER, "weight": 2}]}, "messages[1].weight: must be 0 or 1, got 2"),
    ({"messages": [USER, {**ANSWER, "weight": True}]}, "messages[1].weight: must be 0 or 1"),
    ({"messages": [USER, {**ANSWER, "weight": 0}]}, "every assistant turn has weight 0, so nothing trains"),
    ({"messages": [USER]}, "messages: no assistant turn"),
    ({"messages": [{**USER, "colour": "red"}, ANSWER]}, "messages[0].colour: unknown field"),
    ({"messages": [USER, ANSWER], "tool": TOOLS}, "tool: unknown field"),
    ({"messages": [{"role": "user"}, ANSWER]}, "messages[0].content: a user turn needs content"),
    (
        {"messages": [USER, {"role": "assistant", "tool_calls": [call(name="get_wether")]}], "tools": TOOLS},
        "messages[1].tool_calls[0].function.name: 'get_wether' is not one of the row's tools (get_weather)",
    ),
    (
        {"messages": [USER, {"role": "assistant", "tool_calls": [call(args="{city")]}]},
        "messages[1].tool_calls[0].function.arguments: not valid JSON",
    ),
    (
        {"messages": [USER, {"role": "assistant", "tool_calls": [call(args="[1]")]}]},
        "messages[1].tool_calls[0].function.arguments: must be a JSON object, got a list",
    ),
    (
        {
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
            ]
        },
        "messages[1].tool_calls[0].id: required field missing",
    ),
    (
        {"messages": [USER, {"role": "assistant", "tool_calls": [{**call(), "type": "code"}]}]},
        "messages[1].tool_calls[0].type: Input should be 'function'",
    ),
    (
        {"messages": [USER, {"role": "tool", "tool_call_id": "c9", "content": "x"}, ANSWER]},
        "messages[1].tool_call_id: 'c9' matches no earlier assistant tool call",
    ),
    (
        {
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [call()]},
                {"role": "tool", "tool_call_id": "c2", "content": "x"},
                ANSWER,
            ]
        },
        "messages[2].tool_call_id: 'c2' matches no earlier assistant tool call",
    ),
    (
        {"messages": [USER, {"role": "tool", "content": "x"}, ANSWER]},
        "messages[1].tool_call_id: a tool message needs the id of the call it answers",
    ),
    (
        {"messages": [{**USER, "tool_calls": [call()]}, ANSWER]},
        "messages[0].tool_calls: only assistant turns",
    ),
    ({"messages": [{**USER, "tool_call_id": "c1"}, ANSWER]}, "messages[0].tool_call_id: only tool messages"),
    ({"messages": [USER, ANSWER], "tools": TOOLS * 2}, "tools: the tool 'get_weather' is defined twice"),
    (
        {"messages": [USER, ANSWER], "tools": [{"type": "function"}]},
        "tools[0].function: required field missing",
    ),
    ({"input_ids": [1, 2], "weights": [1]}, "weights: 1 weights for 2 input_ids; they must match"),
    ({"input_ids": [1, -2], "weights": [1, 1]}, "input_ids[1]: must be a token id (an integer >= 0), got -2"),
    ({"input_ids": [1, 2.0], "weights": [1, 1]}, "input_ids[1]: must be a token id"),
    ({"input_ids": [1, 2], "weights": [1, -1]}, "weights[1]: must be a finite number >= 0, got -1"),
    ({"input_ids": [1, 2], "weights": [1, "1"]}, "weights[1]: must be a finite number >= 0"),
    ({"input_ids": [], "weights": []}, "input_ids: empty"),
    ({"input_ids": [1, 2], "weights": [0, 0]}, "weights: all zero, so nothing trains"),
]


@pytest.mark.parametrize(("row", "reason"), REFUSALS, ids=[r for _, r in REFUSALS])
def test_refusal_reasons_name_the_row_and_field(tmp_path: Path, row: object, reason: str) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"messages": [USER, ANSWER]}, row, {"messages": [USER, ANSWER]}]
    )
    results = list(read_rows(path))
    assert [type(r) for r in results] == [ChatRow, RefusedRow, ChatRow]  # a bad row never stops the others
    refused = results[1]
    assert isinstance(refused, RefusedRow)
    assert refused.row_number == 2
    assert reason in refused.reason, refused.reason


def test_invalid_json_and_utf8_blank_lines_and_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    good = json.dumps({"messages": [USER, ANSWER]}).encode()
    path.write_bytes(b"\n".join([good, b"", b"   ", b'{"messages": [', b"\xff\xfe{}", good]) + b"\n")
    results = list(read_rows(path))
    assert [r.row_number for r in results] == [1, 4, 5, 6]  # blank lines skipped but counted
    assert results[1].reason.startswith("invalid JSON")
    assert results[2].reason.startswith("not UTF-8 text")
    assert isinstance(results[3], ChatRow)


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such data file"):
        read_rows(tmp_path / "nope.jsonl")


def test_iter_rows_numbers_records() -> None:
    results = list(iter_rows([{"messages": [USER, ANSWER]}, {"x": 1}]))
    assert isinstance(results[0], ChatRow)
    assert results[1] == RefusedRow(
        2, "the row has neither messages (chat) nor input_ids and weights (tokenized)"
    )


def test_reading_streams_and_stops_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = json.dumps({"messages": [USER, {"role": "assistant", "content": "x" * 2000}]})
    path = tmp_path / "big.jsonl"
    path.write_text((line + "\n") * 4000)  # ~8 MB
    size = path.stat().st_size

    handles = []
    real_open = Path.open

    def spy_open(self: Path, *args: object, **kwargs: object):
        handle = real_open(self, *args, **kwargs)
        handles.append(handle)
        return handle

    monkeypatch.setattr(Path, "open", spy_open)
    rows = read_rows(path)
    first = [next(rows) for _ in range(3)]
    assert all(isinstance(r, ChatRow) for r in first)
    assert handles[0].tell() < size / 50  # three rows in: only a buffer's worth was read
    rows.close()
    assert handles[0].closed
    monkeypatch.undo()

    tracemalloc.start()
    count = sum(1 for _ in read_rows(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 4000
    assert peak < size / 20, f"peak {peak} bytes for a {size}-byte file"
