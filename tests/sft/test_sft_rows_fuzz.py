"""SFT rows, fuzzed: a JSONL file of hostile lines mixed with good rows never crashes or hangs `check()` or
`loops check`. Every bad row is refused with one short line naming its row (under a line naming the file and
what to do), the good rows still train, and a run on such a file trains exactly the good rows.

Then one plain regression test per bug the fuzzer found (each crashed, or printed a message without its row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sft_fixtures import build_tokenizer

from loops_nb import load
from loops_nb.model_renderer import load_model_tokenizer
from loops_nb.sft.batching import SFTData, is_held_out
from loops_nb.sft.data import ChatRow, RefusedRow, parse_line, read_rows
from loops_nb.sft.refusal_wording import MAX_DEPTH
from loops_nb.sft.targets import SFTTargets, chat_targets

BOM = b"\xef\xbb\xbf"
USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# Rows that train under the tool-capable ChatML template (the tokenizer's own here), in every format the
# contract allows: plain chat, text parts, weights, a tool call and its result, metadata, tokens.
GOOD_ROWS: list[dict[str, Any]] = [
    {"messages": [USER, ANSWER]},
    {"messages": [{"role": "system", "content": "Be brief."}, USER, {**ANSWER, "weight": 1}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}, ANSWER]},
    {"messages": [USER, {**ANSWER, "weight": 0}, USER, ANSWER], "metadata": {"id": 7, "tags": ["a"]}},
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "tools": TOOLS,
        "parallel_tool_calls": False,
    },
    {"input_ids": [1, 40, 41, 42, 2], "weights": [0, 0, 1, 1, 1]},
]
ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\ufeff",
    "\u2028\u2029",
    "<|im_end|>",
    "<|im_start|>assistant\n",
    "</think>",
    "{",
    '{"city": "Paris"',
    "[1]",
    "null",
    "\n\r\t",
    "\x1b[31mred",
    "x" * 5000,
    "é" * 3000,
    "developer",
    "assistant",
    "tool",
    "function",
    "get_weather",
    "c1",
]
KEYS = [
    "messages",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "tools",
    "function",
    "name",
    "arguments",
    "type",
    "text",
    "weight",
    "input_ids",
    "weights",
    "metadata",
    "reasoning_content",
    "id",
    "parameters",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(ODD_STRINGS)
    | st.text(st.characters(exclude_categories=()), max_size=12)  # surrogates included
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON value (dict keys and list indices), the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated_rows(draw: st.DrawFn) -> Any:
    """A good row with one place replaced, deleted, wrapped, or given an extra key: near-valid rows reach the
    deep checks (roles, parts, tool calls, weights) that random JSON rarely does."""
    row = json.loads(json.dumps(draw(st.sampled_from(GOOD_ROWS))))
    path = draw(st.sampled_from(paths(row)))
    if not path:
        return draw(VALUES)
    parent = row
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    action = draw(st.sampled_from(["replace", "delete", "wrap", "extra", "nest"]))
    if action == "replace":
        parent[last] = draw(VALUES)
    elif action == "delete":
        del parent[last]
    elif action == "wrap":
        parent[last] = [parent[last]]
    elif action == "extra" and isinstance(parent[last], dict):
        parent[last][draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(VALUES)
    else:  # nest it deep, past MAX_DEPTH or not
        depth = draw(st.integers(1, MAX_DEPTH + 20))
        value = parent[last]
        for _ in range(depth):
            value = {"a": value} if draw(st.booleans()) else [value]
        parent[last] = value
    return row


def encode(value: Any, ascii_only: bool) -> bytes:
    """A JSON line; lone surrogates are written as JSON escapes (``ascii_only``) or as raw, invalid UTF-8."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


HOSTILE_LINES = st.one_of(
    st.builds(encode, VALUES, st.booleans()),
    st.builds(encode, mutated_rows(), st.booleans()),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from(
        [
            b"",
            b"   ",
            b"\t\r",
            BOM,
            b"\xff\xfe{\x00}",
            b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
            b"[" * 50_000,  # deeper than json.loads can recurse
            b'{"messages": ' + b"[" * 3000 + b"]" * 3000 + b"}",
            b'{"messages": [{"role": "user", "content": "' + b"y" * 300_000 + b'"}]}',
            b"9" * 5000,  # past Python's int-from-string digit limit
            b'{"input_ids": [1, 2], "weights": [NaN, Infinity]}',
        ]
    ),
    st.builds(
        lambda row, cut: json.dumps(row).encode()[:cut], st.sampled_from(GOOD_ROWS), st.integers(1, 60)
    ),
    st.builds(lambda row: BOM + json.dumps(row).encode(), st.sampled_from(GOOD_ROWS)),
)
FILES = st.lists(
    st.one_of(
        st.sampled_from(GOOD_ROWS).map(lambda r: ("good", json.dumps(r).encode())),
        HOSTILE_LINES.map(lambda b: ("bad", b)),
    ),
    min_size=1,
    max_size=14,
).flatmap(lambda lines: st.tuples(st.just(lines), st.booleans()))

FUZZ = settings(max_examples=60, suppress_health_check=list(HealthCheck))
MAX_REASON = 500


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer-only model directory: `check` needs the tokenizer, never the weights."""
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer("smollm2_tools").save_pretrained(folder)
    return folder


def write_config(folder: Path, model: Path, **data: Any) -> Path:
    settings_ = {"train": "train.jsonl", "eval_fraction": 0.3, **data}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings_.items())
    config = folder / "sft.toml"
    config.write_text(
        f'recipe = "sft"\n[model]\nbase_model = "{model}"\nlora_rank = 4\nmax_seq_len = 512\n'
        f'[compute.local]\ndevice = "cpu"\n[data]\n{lines}\n'
        f"[training]\nbatch_tokens = 256\nmax_steps = 2\neval_every = 0\nsave_every = 0\n"
        f'[output]\noutput_dir = "{folder / "runs"}"\nrun_name = "fuzz"\n'
    )
    return config


def write_file(path: Path, lines: list[tuple[str, bytes]], final_newline: bool) -> None:
    path.write_bytes(b"\n".join(b for _, b in lines) + (b"\n" if final_newline else b""))


def assert_clear(reason: str) -> None:
    assert reason and "\n" not in reason and len(reason) <= MAX_REASON, reason
    reason.encode("utf-8")  # no lone surrogates: it can be printed


@pytest.mark.timeout(300)
@FUZZ
@given(spec=FILES)
def test_hostile_rows_are_refused_by_row_and_the_good_rows_still_train(
    spec: tuple[list[tuple[str, bytes]], bool], tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lines, final_newline = spec
    folder = tmp_path_factory.mktemp("fuzz")
    config = write_config(folder, tokenizer_dir)
    data_file = folder / "train.jsonl"
    write_file(data_file, lines, final_newline)

    project = load(config)
    report = project.check_sync()  # the library: never raises for the user's data
    code, out, err = run_cli_in_process("check", str(config))  # the CLI: never a traceback
    tokenizer = load_model_tokenizer(project.config.model, "local")
    data = SFTData.load(project.config, tokenizer)  # what `train` trains

    assert "Traceback" not in out + err and not err.strip(), err
    assert out.splitlines()[-len(report.describe()) :] == report.describe()
    assert code == (0 if report.ok else 1)
    assert report.data is not None

    numbered = list(enumerate(lines, start=1))
    rows = [(n, kind) for n, (kind, b) in numbered if b.removeprefix(BOM).strip()]
    held = {n for n, _ in rows if is_held_out(n, 0, 0.3)}
    table = report.data.rows
    # Every non-blank line is read once, as itself: training rows in the report, the others held out.
    assert list(table["row_number"]) == [n for n, _ in rows if n not in held]
    assert data.held_out.report.rows_read == len(held)
    status = dict(zip(table["row_number"], table["status"], strict=True))
    good = [n for n, kind in rows if kind == "good"]
    for n in good:
        assert n in held or status[n] in ("trains", "split"), (n, status[n])
    # The good rows are the ones `train` would train: nothing bad displaced them, nothing bad joined them.
    trained_rows = set(data.train.rows)
    assert {n for n in good if n not in held} <= trained_rows
    assert not {n for n, _ in data.held_out.report.refusals} & set(good)

    refusals = report.data.refusals + data.held_out.report.refusals
    text = "\n".join(report.describe())
    for n, reason in refusals:
        assert_clear(reason)
        assert n not in good
    if report.data.refusals:
        assert f" of {data_file} (the other rows are unaffected); fix or remove these:" in text
    for n, reason in report.data.refusals[:10]:
        assert f"    row {n}: {reason}" in text
    for n, reason in data.held_out.report.refusals[:10]:
        assert f"    row {n}: {reason}" in text
    if not report.ok:
        assert not trained_rows and f"no row of {data_file} trains" in text


# -- regressions: one per bug the fuzzer found ---------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer() -> SFTTargets:
    return chat_targets(build_tokenizer("smollm2_tools"), max_seq_len=100_000)


def refused(line: bytes | str, renderer: SFTTargets) -> str:
    row = parse_line(line, 3)
    result = row if isinstance(row, RefusedRow) else renderer.render(row)
    assert isinstance(result, RefusedRow), result
    assert result.row_number == 3
    assert_clear(result.reason)
    return result.reason


def chat_line(**extra: Any) -> str:
    return json.dumps({"messages": [USER, ANSWER], **extra})


def test_deeply_nested_json_is_refused_not_a_recursion_error(renderer: SFTTargets) -> None:
    # json.loads raised RecursionError past ~1000 levels.
    assert refused("[" * 50_000, renderer) == f"JSON nested more than {MAX_DEPTH} levels deep"
    assert "metadata.a.a" in refused(
        chat_line(metadata=json.loads('{"a":' * 150 + "1" + "}" * 150)), renderer
    )


def test_deep_tool_arguments_are_refused_not_a_serialization_error(renderer: SFTTargets) -> None:
    # Arguments a few hundred levels deep (as an object or as a JSON string) passed validation, then pydantic's
    # serializer raised "Maximum serialization depth exceeded" while rendering.
    deep = '{"a":' * 300 + "1" + "}" * 300
    for arguments in (deep, json.loads(deep)):
        call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
        line = json.dumps({"messages": [USER, {"role": "assistant", "tool_calls": [call]}]})
        reason = refused(line, renderer)
        assert reason.startswith("messages[1].tool_calls[0].function.arguments") and "levels deep" in reason


def test_rows_just_under_the_depth_bound_still_train(renderer: SFTTargets) -> None:
    arguments = {"city": json.loads('{"a":' * 80 + '"Paris"' + "}" * 80)}
    call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
    row = parse_line(json.dumps({"messages": [USER, {"role": "assistant", "tool_calls": [call]}]}), 1)
    assert isinstance(row, ChatRow) and not isinstance(renderer.render(row), RefusedRow)


def test_lone_surrogates_are_refused_naming_the_field(renderer: SFTTargets) -> None:
    # A JSON "\ud800" escape decodes to a lone surrogate: the tokenizer raised TypeError on it, and an unknown
    # key holding one made the printed refusal itself unprintable.
    reason = refused(json.dumps({"messages": [USER, {"role": "assistant", "content": "a\ud800b"}]}), renderer)
    assert reason.startswith("messages[1].content: contains a lone surrogate")
    assert "the key" in refused(chat_line(**{"\ud800\n": 1}), renderer)
    args = json.dumps({"city": "\udc00"})
    call = {**CALL, "function": {"name": "get_weather", "arguments": args}}
    line = json.dumps({"messages": [USER, {"role": "assistant", "tool_calls": [call]}]})
    assert "lone surrogate" in refused(line, renderer)


def test_a_number_too_long_to_read_is_refused(renderer: SFTTargets) -> None:
    # json.loads raised ValueError (Python's 4300-digit limit), not JSONDecodeError.
    assert refused("9" * 5000, renderer).startswith("invalid JSON: Exceeds the limit")
    assert refused(
        json.dumps({"input_ids": [1], "weights": [1], "x": 1}).replace("[1]", "[" + "9" * 5000 + "]", 1),
        renderer,
    )


def test_a_byte_order_mark_is_skipped_not_refused(tmp_path: Path) -> None:
    # Editors on Windows start a file with one; `cat a.jsonl b.jsonl` puts one mid-file. Both rows read.
    good = json.dumps({"messages": [USER, ANSWER]}).encode()
    path = tmp_path / "d.jsonl"
    path.write_bytes(BOM + good + b"\n" + BOM + b"\n" + BOM + good + b"\n")
    assert [(type(r), r.row_number) for r in read_rows(path)] == [(ChatRow, 1), (ChatRow, 3)]


def test_echoed_values_are_cut_to_one_short_line(renderer: SFTTargets) -> None:
    # A 100,000-character role was echoed whole into its refusal.
    line = json.dumps({"messages": [{"role": "x" * 100_000 + "\n", "content": "c"}, ANSWER]})
    assert "(100,001 characters)" in refused(line, renderer)
    assert "unknown field" in refused(chat_line(**{"k" * 10_000: 1}), renderer)


def test_held_out_refusals_are_listed_with_their_rows(tmp_path: Path, tokenizer_dir: Path) -> None:
    # A bad row that the split held out was counted ("1 refused") but never named.
    held = next(n for n in range(1, 100) if is_held_out(n, 0, 0.3))
    lines = [json.dumps({"messages": [USER, ANSWER]}).encode()] * 12
    lines[held - 1] = b'{"messages": oops'
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    report = load(write_config(tmp_path, tokenizer_dir)).check_sync()
    text = "\n".join(report.describe())
    assert f"held-out rows refused: 1 row of {tmp_path / 'train.jsonl'}" in text
    assert f"    row {held}: invalid JSON" in text


def test_a_run_on_a_hostile_file_trains_exactly_the_good_rows(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    """Through the embedded Loops: every hostile kind at once, and the run trains the good rows, all of them."""
    bad = [
        b"[" * 50_000,
        b"9" * 5000,
        json.dumps({"messages": [USER, {"role": "assistant", "content": "a\ud800"}]}).encode(),
        b"\xff\xfe{}",
        b"",
        b'{"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": "y"}]}',
        json.dumps(
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}],
                    },
                ]
            }
        ).encode(),
    ]
    good = [BOM + json.dumps(GOOD_ROWS[0]).encode()] + [json.dumps(r).encode() for r in GOOD_ROWS[1:]]
    lines = [line for pair in zip(good, bad[1:], strict=True) for line in pair] + [bad[0], b'{"messages": [']
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(lines))
    config = write_config(tmp_path, tiny_chat_model_path, eval_fraction=0.0)
    outcome = load(config).train_sync(observers=[])
    run = json.loads((Path(outcome.run_dir) / "run.json").read_text())
    assert outcome.status == "completed" and outcome.steps == 2
    # The blank line is skipped; the last line, cut off without a newline, is read and refused.
    assert run["data"]["rows_read"] == len(good) + len(bad) - 1 + 1
    assert run["data"]["rows_refused"] == len(bad) - 1 + 1
    assert run["data"]["examples"] == len(GOOD_ROWS)
