"""The in_process_tools pattern: a multi-turn Episode that calls a calculator and a price table.

A scripted sampler writes the tool calls a random tiny model never would, so the episode's loop (calls
executed, results appended as `tool` messages, final answer scored) and the training mask (sampled turns
train, tool results are context) are checked exactly; a 2-step `loops run` on the tiny model checks that
the pattern runs end to end with the tool-capable template.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl, run_cli
from rl_config import tiny_run_toml

PATTERN = Path(__file__).resolve().parents[2] / "patterns" / "custom_runtime" / "in_process_tools"
# Not a test helper: the pattern's own modules (its episode imports shop_tools as a sibling, as under `loops run`).
sys.path.insert(0, str(PATTERN))

from episode import ToolShopper  # noqa: E402
from scripted_policy import ScriptedPolicy  # noqa: E402
from shop_tools import calculate, run_tool  # noqa: E402
from tiny_models import build_tiny_chat_model, build_tiny_tokenizer  # noqa: E402

from loops_nb.llm.capture import TokenCapture  # noqa: E402
from loops_nb.llm.client import LoopsLLM, SamplingDefaults, bind_llm, unbind_llm  # noqa: E402
from loops_nb.llm.renderer import ChatRenderer  # noqa: E402


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "a + 1", "2 ** 999", "1 / 0", "(9**64)**64**2", "9" * 400]
)
def test_the_calculator_refuses_anything_but_bounded_arithmetic(expression: str) -> None:
    with pytest.raises(ValueError):
        calculate(expression)


def test_the_calculator_and_lookup_answer_the_model_in_text() -> None:
    assert calculate("(3 + 4) * 2 - 10 / 4") == 11.5
    call = {"function": {"name": "lookup_price", "arguments": '{"item": "Cherries"}'}}
    assert run_tool(call) == ("7", True)
    assert run_tool({"function": {"name": "calculator", "arguments": "{}"}})[0].startswith("error: missing")
    assert run_tool({"function": {"name": "rm", "arguments": "{}"}})[0].startswith("error: unknown tool")


def call_text(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def test_tool_calls_are_executed_results_appended_and_only_sampled_turns_train() -> None:
    renderer = ChatRenderer(build_tiny_tokenizer())
    script = [
        call_text("lookup_price", item="apple"),
        call_text("lookup_price", item="cherry"),
        call_text("calculator", expression="4 * 3 + 3 * 7"),
        "The total is 33.",
    ]
    llm = LoopsLLM(
        renderer, ScriptedPolicy(renderer, script), TokenCapture(), SamplingDefaults(max_tokens=64)
    )
    episode = ToolShopper()
    task = episode.tasks()[0]
    token = bind_llm(llm)
    try:
        evidence = await episode.run(task)
    finally:
        unbind_llm(token)
    assert evidence.reward == 1.0
    assert evidence.metrics["tool_calls"] == 3 and evidence.metrics["tool_errors"] == 0
    transcript = evidence.transcript
    assert [m["role"] for m in transcript] == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert transcript[2]["tool_calls"][0]["function"]["name"] == "lookup_price"
    assert [m["content"] for m in transcript if m["role"] == "tool"] == ["3", "7", "33"]
    assert transcript[3]["tool_call_id"] == transcript[2]["tool_calls"][0]["id"]
    # One training sequence: the four completions train, the tool results between them do not.
    capture = llm.capture
    assert not capture.breaks
    [sequence] = capture.sequences()
    trained = [t for t, s in zip(sequence.tokens, sequence.sampled, strict=True) if s]
    assert trained == [t for c in capture.calls for t in c.completion_tokens]
    untrained_text = renderer.decode(
        [t for t, s in zip(sequence.tokens, sequence.sampled, strict=True) if not s]
    )
    assert untrained_text.count("<tool_response>") == 3 and "lookup_price" in untrained_text


async def test_a_wrong_final_answer_and_a_turn_limit_score_zero() -> None:
    renderer = ChatRenderer(build_tiny_tokenizer())
    loop = [call_text("calculator", expression="1 + 1")] * 2
    for script, answered in ((["It is 32."], 1.0), (loop, 0.0)):
        llm = LoopsLLM(renderer, ScriptedPolicy(renderer, script), TokenCapture())
        token = bind_llm(llm)
        try:
            evidence = await ToolShopper(max_turns=2).run(ToolShopper().tasks()[0])
        finally:
            unbind_llm(token)
        assert evidence.reward == 0.0
        assert evidence.metrics["answered"] == answered


@pytest.mark.slow
def test_in_process_tools_pattern_runs_two_steps_on_the_tiny_model(tmp_path: Path) -> None:
    # 2048 positions: the tools' system prompt alone is ~600 byte-level tokens.
    model = build_tiny_chat_model(tmp_path / "model", max_position_embeddings=2048)
    for name in ("episode.py", "shop_tools.py"):
        shutil.copy(PATTERN / name, tmp_path / name)
    config = tmp_path / "train.toml"
    config.write_text(
        tiny_run_toml(
            "episode:ToolShopper",
            model,
            tmp_path / "runs",
            options={"max_turns": 3},
            model={"chat_template": "chatml-tools", "max_seq_len": 1024},
            sampling={"max_tokens": 12},
            training={"max_steps": 2, "groups_per_step": 2, "learning_rate": 1e-3, "save_every": 0},
            output={"run_name": "tools", "trace": "full"},
        )
    )
    proc = run_cli("run", config, env={"HF_HUB_OFFLINE": "1"}, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "tools"
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["tokens/sampled"] > 0 for s in steps)
    rollouts = read_jsonl(run / "rollouts.jsonl")
    assert all(r["discarded"] is None for r in rollouts), [r["detail"] for r in rollouts if r["discarded"]]
    attempts = json.loads((run / "transcripts" / "step-000000.json").read_text())
    first = attempts[0]
    assert "<tools>" in first["calls"][0]["prompt"], "the tool-capable template did not list the tools"
    assert first["transcript"][0]["role"] == "system" and first["transcript"][2]["role"] == "assistant"
