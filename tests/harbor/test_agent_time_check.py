"""`loops check` on the local scope warns when a task's agent timeout is shorter than the model calls it needs.

Public Harbor tasks give their agent 60-120 s, written for a GPU; Terminus-2's calls take about half a minute
each on a CPU, so attempts were cut off after one or two calls and nothing said why or which setting to raise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import run_cli_in_process
from rl_config import tiny_run_toml

import loops_nb
from loops_nb.local.call_time import LocalCallSpeed
from loops_nb.rl.agent_time_check import _warning
from loops_nb.runtime import AgentTimeLimit

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"


def terminus_config(tmp_path: Path, model: Path, *, task_timeout: int, **options: object) -> Path:
    task = tmp_path / "tasks" / "hidden_game"
    shutil.copytree(HIDDEN_GAME, task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace("[agent]\ntimeout_sec = 600", f"[agent]\ntimeout_sec = {task_timeout}")
    )
    path = tmp_path / "train.toml"
    path.write_text(
        tiny_run_toml(
            "loops_nb.harbor:create_runtime",
            model,
            tmp_path / "runs",
            options={
                "tasks": task,
                "agent": "loops_nb.harbor.terminus_agent:LoopsTerminus2",
                "model_access": "openai_http",
                "provider": "sandbox",
                "agent_kwargs": {"max_turns": 40},
                **options,
            },
            providers={"sandbox": {"type": "local", "scratch_dir": tmp_path / "scratch"}},
            sampling={"max_tokens": 2048},
            training={"attempt_timeout_seconds": 100000},
        )
    )
    return path


def test_the_warning_names_the_setting_the_calls_and_a_timeout_that_fits(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    from loops_nb.llm.renderer import ChatRenderer

    config = loops_nb.load(terminus_config(tmp_path, tiny_chat_model_path, task_timeout=60)).config
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_chat_model_path))
    limit = AgentTimeLimit(
        "game", 60.0, "[agent] timeout_sec in task.toml", 4, "agent_kwargs.max_turns = 4", "hi"
    )
    speed = LocalCallSpeed(prefill_seconds_per_token=0.0, decode_seconds_per_token=0.01, concurrent=8)
    warning = _warning(limit, config, renderer, speed)  # 2048 tokens x 0.01 s: about 20 s per call
    assert warning is not None
    assert warning.startswith(
        "task game: the agent has 60 s ([agent] timeout_sec in task.toml), and a model call "
    )
    assert "so 4 call(s) (agent_kwargs.max_turns = 4) need about 82 s" in warning
    assert "cut off after about 2 call(s)" in warning
    assert "Set [runtime.options] agent_timeout_seconds = 180 (twice the estimate)" in warning
    roomy = AgentTimeLimit("game", 600.0, "x", 4, "y", "hi")
    assert _warning(roomy, config, renderer, speed) is None


@pytest.mark.bwrap
def test_check_warns_about_a_task_timeout_too_short_for_terminus_2_here(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    result = run_cli_in_process("check", terminus_config(tmp_path, tiny_chat_model_path, task_timeout=1))
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    timed = [w for w in warnings if "agent_timeout_seconds" in w]
    assert len(timed) == 1, result.stdout
    assert "task hidden_game: the agent has 1 s ([agent] timeout_sec in " in timed[0]
    assert "40 call(s) (agent_kwargs.max_turns = 40)" in timed[0]
    overridden = terminus_config(
        tmp_path / "o", tiny_chat_model_path, task_timeout=1, agent_timeout_seconds=100000
    )
    result = run_cli_in_process("check", overridden)
    assert "agent_timeout_seconds =" not in result.stdout, result.stdout
