"""The SFT examples work out of the box, offline: their data is committed and fresh, `loops check` passes with
the real SmolLM2 tokenizer, Toucan's format converts, and (slow) a short local run lowers the held-out loss."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import import_file, read_jsonl, run_cli

from loops_nb import load

REPO = Path(__file__).resolve().parents[2]
TOOL_USE = REPO / "examples" / "sft_tool_use"
TOUCAN = REPO / "examples" / "sft_toucan"


def _env(model_cache_dir: Path) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "LOOPS_NB_CACHE": str(model_cache_dir)}


def test_the_committed_tool_use_data_is_what_make_data_writes(tmp_path):
    subprocess.run([sys.executable, str(TOOL_USE / "make_data.py"), "--out", str(tmp_path)], check=True)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (TOOL_USE / name).read_bytes(), (
            f"{name} is stale: rerun make_data.py"
        )
    rows = read_jsonl(TOOL_USE / "train.jsonl")
    with_calls = [r for r in rows if any(m.get("tool_calls") for m in r["messages"])]
    assert 0.5 < len(with_calls) / len(rows) < 0.9, "both tool calls and direct answers are taught"
    assert {
        c["function"]["name"] for r in with_calls for m in r["messages"] for c in m.get("tool_calls", [])
    } == {
        "get_weather",
        "convert_currency",
        "search_flights",
    }


@pytest.mark.slow
def test_loops_check_reports_the_tool_use_example(model_cache_dir):
    result = run_cli("check", TOOL_USE / "sft_local.toml", env=_env(model_cache_dir), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    out = result.stdout
    assert "chat template built-in 'chatml-tools'" in out
    assert "rows read: 240" in out and "refused: 0" in out
    assert "held-out: the eval file eval.jsonl" in out
    assert "-> 20 steps" in out and out.rstrip().endswith("check: ok")


def test_toucan_records_convert_to_openai_rows():
    prepare = import_file(TOUCAN / "prepare.py", "prepare_under_test")
    record = {
        "uuid": "u1",
        "messages": json.dumps(
            [
                {"role": "user", "content": "Prices of ETH and SOL?"},
                {"role": "assistant", "content": "Checking both."},
                {"role": "tool_call", "content": repr({"name": "price", "arguments": '{"symbol": "ETH"}'})},
                {
                    "role": "tool_call",
                    "content": json.dumps({"name": "price", "arguments": {"symbol": "SOL"}}),
                },
                {"role": "tool_response", "name": "price", "content": '{"price": 3400}'},
                {"role": "tool_response", "name": "price", "content": {"price": 150}},
                {"role": "assistant", "content": "ETH is $3,400 and SOL $150."},
            ]
        ),
        "tools": json.dumps([{"name": "price", "description": "A price.", "parameters": {"type": "object"}}]),
    }
    row = prepare.convert(record)
    messages = row["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = messages[1]["tool_calls"]
    assert messages[1]["content"] == "Checking both."
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"symbol": "ETH"}, {"symbol": "SOL"}]
    assert [m["tool_call_id"] for m in messages[2:4]] == [c["id"] for c in calls]
    assert messages[3]["content"] == '{"price": 150}'
    assert row["tools"] == [{"type": "function", "function": {"name": "price", "description": "A price.",
                                                             "parameters": {"type": "object"}}}]  # fmt: skip
    orphan = {
        "messages": json.dumps([{"role": "user", "content": "x"}, {"role": "tool_response", "content": "y"}])
    }
    with pytest.raises(prepare.Skip, match="answers no call"):
        prepare.convert(orphan)


def test_prepare_offline_writes_the_committed_fixture_split(tmp_path):
    subprocess.run(
        [sys.executable, str(TOUCAN / "prepare.py"), "--offline", "--out", str(tmp_path)],
        check=True,
        timeout=300,
    )
    for name in ("train.jsonl", "eval.jsonl", "prepared.json"):
        assert (tmp_path / name).read_text() == (TOUCAN / name).read_text(), (
            f"{name} is stale: rerun prepare.py"
        )
    summary = json.loads((tmp_path / "prepared.json").read_text())
    assert summary["train"] + summary["eval"] == 32 and summary["eval"] > 0 and not summary["skipped"]


async def test_toucan_check_works_offline_and_asks_for_prepare_when_data_is_missing(
    tmp_path, model_cache_dir, monkeypatch
):
    monkeypatch.setenv("LOOPS_NB_CACHE", str(model_cache_dir))
    report = await load(TOUCAN / "sft_local.toml").check()
    assert report.ok and report.data is not None and report.data.rows_refused == 0
    for name in ("sft_local.toml", "prepare.py"):
        shutil.copy(TOUCAN / name, tmp_path / name)
    missing = await load(tmp_path / "sft_local.toml").check()
    assert not missing.ok
    assert f"run `python {tmp_path / 'prepare.py'}` first" in missing.problems[0]


@pytest.mark.slow
def test_loops_run_on_the_tool_use_example_lowers_the_held_out_loss(tmp_path, model_cache_dir):
    # Two steps without warm-up: the example's own schedule warms up for two, which here only costs time.
    overrides = {
        "training.max_steps": "2",
        "training.warmup_steps": "0",
        "training.batch_tokens": "1024",
        "training.eval_every": "0",
        "training.eval_max_examples": "4",
        "output.output_dir": str(tmp_path),
    }
    args = [item for key, value in overrides.items() for item in (f"--{key}", value)]
    result = run_cli("run", TOOL_USE / "sft_local.toml", *args, env=_env(model_cache_dir), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    evals = read_jsonl(tmp_path / "sft_tool_use_local" / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 2]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"] - 0.05, evals
    assert "held-out loss:" in result.stdout
