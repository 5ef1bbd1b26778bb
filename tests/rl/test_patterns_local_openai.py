"""The local_openai pattern: each attempt's agent is its own process, talking OpenAI HTTP to the gateway.

A 2-step `loops run` on the tiny chat model: every attempt launches `agent.py`, which reaches the policy
only through `OPENAI_BASE_URL` / `OPENAI_API_KEY`; the run must record rollouts and steps, and the
tokens the agents sampled through the gateway must be captured.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import read_jsonl, run_cli
from rl_config import tiny_run_toml
from tiny_models import build_tiny_chat_model

PATTERN = Path(__file__).resolve().parents[2] / "patterns" / "custom_runtime" / "local_openai"


@pytest.mark.slow
def test_local_openai_pattern_trains_through_the_gateway(tmp_path: Path) -> None:
    model = build_tiny_chat_model(tmp_path / "model")
    for name in ("episode.py", "agent.py"):
        shutil.copy(PATTERN / name, tmp_path / name)
    config = tmp_path / "train.toml"
    config.write_text(
        tiny_run_toml(
            "episode:LocalOpenAIAgent",
            model,
            tmp_path / "runs",
            options={"answer": "e"},
            model={"max_seq_len": 256},
            sampling={"max_tokens": 8},
            training={
                "max_steps": 2,
                "groups_per_step": 2,
                "max_concurrent_rollouts": 8,
                "attempt_timeout_seconds": 120,
                "learning_rate": 1e-3,
                "save_every": 0,
            },
            output={"run_name": "openai", "trace": "full"},
        )
    )
    proc = run_cli("run", config, env={"HF_HUB_OFFLINE": "1"}, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "openai"
    steps = read_jsonl(run / "steps.jsonl")
    rollouts = read_jsonl(run / "rollouts.jsonl")
    assert [s["step"] for s in steps] == [0, 1]
    assert len(rollouts) == 2 * 2 * 4
    assert all(r["discarded"] is None for r in rollouts), [r["detail"] for r in rollouts if r["discarded"]]
    assert all(r["sampled_tokens"] > 0 for r in rollouts)
    assert sum(s["tokens/sampled"] for s in steps) > 0
    transcript = json.loads((run / "transcripts" / "step-000000.json").read_text())
    first = transcript[0] if isinstance(transcript, list) else transcript["attempts"][0]
    [call] = first["calls"]
    assert call["completion_tokens"], "the gateway did not capture the agent's tokens"
    assert first["transcript"][1]["role"] == "assistant"
