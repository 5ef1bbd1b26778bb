"""`loops check` of a verifiers config: the environment's tasks and rubric, one episode through the gateway,
and one line for each refusal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli_in_process
from rl_config import tiny_run_toml

FAKE_DRIVER = Path(__file__).with_name("fake_driver.py")


def config(tmp_path: Path, model: Path, env_args: dict[str, Any]) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(
        tiny_run_toml(
            "loops_nb.verifiers:create_runtime",
            model,
            tmp_path / "runs",
            options={
                "env_id": "fake-env",
                "env_args": env_args,
                "python": sys.executable,
                "driver": str(FAKE_DRIVER),
            },
            model={"max_seq_len": 256},
        )
    )
    return path


def problems(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("problem:")]


def test_check_prints_tasks_rubric_and_the_first_call_through_the_gateway(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    result = run_cli_in_process(
        "check", config(tmp_path, tiny_chat_model_path, {"mode": "reward", "tools": [tool]})
    )
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "verifiers 0.4.0, environment fake-env: 3 task(s) (task-0, task-1, task-2)" in out
    assert "rubric FakeRubric: says_word x1, short x0.5" in out
    assert "first call through the gateway: task task-0, 1 message(s), 1 tool(s), prompt" in out
    assert "the rubric scored it 1" in out
    assert "the rubric's positive weights add up to 1.5" in out, "a warning: reward_max defaults to 1"


@pytest.mark.parametrize(
    ("env_args", "says"),
    [
        ({"mode": "null"}, "discarded as no_reward: the environment's rubric returned no reward"),
        ({"list": "load_fail"}, "cannot load: environment package 'vf-missing' is not installed"),
        ({"list": "old_version"}, "verifiers 0.3.1 is outside the tested range"),
    ],
)
def test_check_refuses_in_one_line(
    tmp_path: Path, tiny_chat_model_path: Path, env_args: dict[str, Any], says: str
) -> None:
    result = run_cli_in_process("check", config(tmp_path, tiny_chat_model_path, env_args))
    assert result.returncode == 1, result.stdout
    found = problems(result.stdout)
    assert len(found) == 1, result.stdout
    assert says in found[0]
