"""`loops check` hides no refusal and leaves none without a fix: `--refusals FILE` writes every refused row
(training and held-out) as JSONL, the summary names that option, every reason kind has a fix, and held-out data
that yields no example is a warning that changes the check's last line."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl
from sft_fixtures import build_tokenizer, write_jsonl
from test_sft_data import REFUSALS

from loops_nb import load
from loops_nb.cli import main as loops_main
from loops_nb.sft.data import RefusedRow, parse_line, parse_row
from loops_nb.sft.refusal_wording import FALLBACK_FIX, refused_field, remedy, with_fix
from loops_nb.sft.targets import chat_targets

USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris."}
GOOD = {"messages": [USER, ANSWER]}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CHATML = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
GEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer-only model directory: `check` needs the tokenizer, never the weights."""
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer("smollm2_tools").save_pretrained(folder)
    return folder


def _config(folder: Path, model: Path, **data: Any) -> Path:
    settings = {"train": "train.jsonl", **data}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    (folder / "sft.toml").write_text(
        f'recipe = "sft"\n[model]\nbase_model = "{model}"\nlora_rank = 4\nmax_seq_len = 64\n'
        f'[compute.local]\ndevice = "cpu"\n[data]\n{lines}\n[training]\nbatch_tokens = 256\n'
        f'[output]\noutput_dir = "{folder / "runs"}"\n'
    )
    return folder / "sft.toml"


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = loops_main(list(argv))
    return code, out.getvalue()


def _bad(i: int) -> str:
    return "not json" if i % 2 else json.dumps({"messages": [{"role": "robot", "content": "x"}, ANSWER]})


def test_refusals_file_holds_every_refusal_and_the_summary_names_the_option(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_jsonl(tmp_path / "train.jsonl", [GOOD, *(_bad(i) for i in range(13)), GOOD])
    write_jsonl(tmp_path / "eval.jsonl", [GOOD, "{oops", {"input_ids": [1], "weights": [1]}])
    config = _config(tmp_path, tokenizer_dir, eval="eval.jsonl")

    code, out = _cli("check", str(config))
    assert code == 0, out
    assert "report.rows" not in out
    assert "    ... and 3 more (`loops check CONFIG --refusals FILE` writes them all)" in out

    target = tmp_path / "out" / "refusals.jsonl"
    code, out = _cli("check", str(config), "--refusals", str(target), "--training.max_steps", "3")
    assert code == 0, out
    assert f"    ... and 3 more (all are in {target})" in out
    assert f"note: 15 refused row(s) written to {target}" in out
    records = read_jsonl(target)
    assert [(Path(r["file"]).name, r["row"]) for r in records] == [
        *(("train.jsonl", n) for n in range(2, 15)),
        ("eval.jsonl", 2),
        ("eval.jsonl", 3),
    ]
    assert all(set(r) == {"file", "row", "field", "reason", "fix"} for r in records)
    assert records[0]["field"] == "messages[0].role" and "unknown role 'robot'" in records[0]["reason"]
    assert records[0]["fix"] == "use one of the roles system, user, assistant, tool"
    assert records[1]["field"] is None and records[1]["reason"].startswith("invalid JSON")
    assert records[-1]["field"] == "weights" and "first token can never train" in records[-1]["reason"]
    assert all(r["fix"] != FALLBACK_FIX for r in records)
    # The listed refusals end in what to do, too (once: the unknown role's reason already says it).
    assert "row 3: invalid JSON: Expecting value (column 1); make the line one JSON object" in out
    assert (
        "row 2: messages[0].role: unknown role 'robot'; expected one of system, user, assistant, tool\n"
        in out
    )


def test_refusals_is_an_option_of_sft_checks_only(tmp_path: Path) -> None:
    code, out = _cli("check", "patterns/custom_runtime/in_process_direct/train_local.toml", "--refusals", "x")
    assert code == 2 and "--refusals is for SFT configs" in out
    assert not Path("x").exists()


def _render_reasons(smollm2: Any) -> list[str]:
    """Refusals only rendering finds: template, survival, length, vocabulary, first-token reasons."""
    cases: list[tuple[dict, str | None]] = [
        ({"messages": [USER, {"role": "assistant", "tool_calls": [CALL]}], "tools": TOOLS}, None),
        ({"messages": [USER, {"role": "assistant", "content": "x " * 200}]}, None),
        ({"messages": [USER, {"role": "assistant", "content": "Paris.<|im_end|>"}]}, None),
        ({"messages": [ANSWER, USER, ANSWER]}, None),
        ({"input_ids": [1, 10**6], "weights": [0, 1]}, None),
        ({"messages": [USER, ANSWER]}, "{{ raise_exception('Conversation roles must alternate') }}"),
        (
            {"messages": [USER, ANSWER]},
            CHATML + "{% if add_generation_prompt %}{{ '<|im_start|>x\n' }}{% endif %}",
        ),
        (
            {"messages": [USER, ANSWER]},
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '\n' }}{% endfor %}"
            + GEN,
        ),
        (
            {"messages": [USER, ANSWER]},
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] if m['role'] != "
            "'assistant' else 'OK') + '<|im_end|>\n' }}{% endfor %}" + GEN,
        ),
    ]
    reasons = []
    for row, template in cases:
        result = chat_targets(smollm2, chat_template=template, max_seq_len=64).render(parse_row(row, 1))  # type: ignore[arg-type]
        assert isinstance(result, RefusedRow), row
        reasons.append(result.reason)
    return reasons


def test_every_refusal_says_what_to_do(smollm2: Any) -> None:
    lines = [b"not json", b"\xff\xfe{}", b"[" * 200, b"[1, 2]", b'"\\ud800"', b'{"messages": ["\\ud800"]}']
    reasons = [parse_line(line, 1).reason for line in lines]  # type: ignore[union-attr]
    for row, _ in REFUSALS:
        result = parse_row(row, 1) if not isinstance(row, str) else parse_line(row, 1)
        assert isinstance(result, RefusedRow), row
        reasons.append(result.reason)
    reasons += [parse_row({"input_ids": [1, 2], "weights": [1, 0]}, 1).reason]  # type: ignore[union-attr]
    reasons += _render_reasons(smollm2)
    for reason in reasons:
        assert remedy(reason) != FALLBACK_FIX, reason
        assert with_fix(reason).startswith(reason), reason
    too_long = next(r for r in reasons if "longer than max_seq_len 64" in r)
    assert (
        "raise [model] max_seq_len (up to the model's context length) or split the conversation" in too_long
    )
    assert with_fix(too_long) == too_long, "a reason that says what to do is not told twice"
    assert refused_field("messages[1].tool_calls[0].function.name: 'x' is not ...") == (
        "messages[1].tool_calls[0].function.name"
    )


async def test_held_out_data_that_yields_no_example_is_a_warning(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [GOOD] * 4)
    write_jsonl(tmp_path / "eval.jsonl", ["{oops", _bad(0), {"input_ids": [1], "weights": [1]}])
    report = await load(_config(tmp_path, tokenizer_dir, eval="eval.jsonl")).check()
    assert report.ok
    (warning,) = report.warnings
    assert str(tmp_path / "eval.jsonl") in warning and "yields no example" in warning
    assert "row 1: invalid JSON" in warning and "row 2: messages[0].role: unknown role" in warning
    assert report.describe()[-1] == "check: ok with 1 warning(s)"
    assert f"warning: {warning}" in report.describe()

    # A fraction that holds out no row of a small file is the same warning.
    write_jsonl(tmp_path / "train.jsonl", [GOOD])
    report = await load(_config(tmp_path, tokenizer_dir, eval_fraction=0.01)).check()
    assert report.ok and "has no row" in report.warnings[0] and report.describe()[-1] != "check: ok"
