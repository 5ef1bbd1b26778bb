"""`loops check` with the local provider runs start()'s static checks and warns about verifiers it cannot run.

A task whose Dockerfile COPYs outside the sandbox's writable paths used to pass `check` under
`ignore_dockerfile = true` and fail at its first trial; a verifier that fetches from the network passed
`check` and then scored 0 offline.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli_in_process
from oracle_trials import run_oracle
from rl_config import tiny_run_toml

pytestmark = pytest.mark.bwrap

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"
PUBLIC_STYLE = Path(__file__).resolve().parent / "tasks" / "public_style"

AGENT = """
from loops_nb.harbor import LoopsAgent


class Silent(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.write_file(environment, "/app/answer.txt", "Monopoly")
"""


def config(tmp_path: Path, model: Path, tasks: Path, **sandbox: Any) -> Path:
    """A config for one local-sandbox attempt of agent:Silent on `tasks`; `sandbox`: more provider settings."""
    (tmp_path / "agent.py").write_text(AGENT)
    path = tmp_path / "train.toml"
    path.write_text(
        tiny_run_toml(
            "loops_nb.harbor:create_runtime",
            model,
            tmp_path / "runs",
            options={"tasks": tasks, "agent": "agent:Silent", "provider": "sandbox"},
            model={"max_seq_len": 256},
            providers={"sandbox": {"type": "local", "scratch_dir": tmp_path / "scratch", **sandbox}},
            training={"group_size": 2},
        )
    )
    return path


def copy_out_task(tmp_path: Path) -> Path:
    task = tmp_path / "tasks" / "copy_out"
    shutil.copytree(HIDDEN_GAME, task)
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.12\nRUN pip install numpy\nWORKDIR /app\nCOPY tool.sh /usr/local/bin/\n"
    )
    (task / "environment" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    return task


def test_check_refuses_a_copy_outside_the_writable_paths_even_with_ignore_dockerfile(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    copy_out_task(tmp_path)
    path = config(tmp_path, tiny_chat_model_path, tmp_path / "tasks", ignore_dockerfile=True)
    result = run_cli_in_process("check", path)
    assert result.returncode == 1, result.stdout
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert len(problems) == 1, result.stdout  # the RUN line is ignored as asked; the COPY cannot be
    assert (
        "task copy_out: Dockerfile COPY tool.sh /usr/local/bin/: /usr/local/bin/ is outside the local "
        in problems[0]
    )
    assert "copy into the WORKDIR instead" in problems[0]


async def test_the_trial_refuses_it_at_start_with_the_same_line_and_no_traceback(tmp_path: Path) -> None:
    task = copy_out_task(tmp_path)
    result = await run_oracle(task, tmp_path)
    assert result.exception_info.exception_type == "TaskNeedsImage"
    assert (
        "Dockerfile COPY tool.sh /usr/local/bin/: /usr/local/bin/ is outside"
        in result.exception_info.exception_message
    )
    assert result.verifier_result is None


def test_check_warns_about_a_verifier_that_needs_network_and_not_about_the_standard_one(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(PUBLIC_STYLE, tasks / "standard")
    shutil.copytree(PUBLIC_STYLE, tasks / "fetches")
    test_sh = tasks / "fetches" / "tests" / "test.sh"
    test_sh.write_text(
        test_sh.read_text().replace(
            "source $HOME", "curl -fsSL https://example.com/grader.py -o /tmp/grader.py\nsource $HOME"
        )
    )
    result = run_cli_in_process("check", config(tmp_path, tiny_chat_model_path, tasks))
    assert result.returncode == 0, result.stdout
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stdout  # the standard uv + pytest verifier runs offline: no warning
    assert "task fetches: tests/test.sh line 8 fetches https://example.com/grader.py" in warnings[0]
    assert 'network = "host"' in warnings[0]
    assert "check: ok with 1 warning(s)" in result.stdout
    online = run_cli_in_process("check", config(tmp_path, tiny_chat_model_path, tasks, network="host"))
    assert online.returncode == 0 and "warning:" not in online.stdout, online.stdout


def test_check_refuses_a_task_with_skills_for_an_agent_without_them(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    task = tmp_path / "tasks" / "skilled"
    shutil.copytree(HIDDEN_GAME, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", '[environment]\nskills_dir = "/skills"\n'))
    result = run_cli_in_process("check", config(tmp_path, tiny_chat_model_path, tmp_path / "tasks"))
    assert result.returncode == 1, result.stdout
    assert "task skilled: it has skills" in result.stdout and "capabilities.skills" in result.stdout
