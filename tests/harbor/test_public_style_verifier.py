"""Harbor's standard verifier in the local sandbox: graded for real offline, or discarded, never scored 0.

The task in tests/harbor/tasks/public_style has the harbor-cookbook shape: its test.sh runs `apt-get
install -y curl`, `curl -LsSf https://astral.sh/uv/.../install.sh | sh`, then `uvx -p 3.12 -w pytest==8.4.1
-w pytest-json-ctrf==0.3.5 pytest --ctrf ...`, and writes reward 1 or 0 from pytest's exit code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from loops_nb.harbor.evidence import evidence_from_trial
from loops_nb.providers.local_verifier import PROBLEMS_FILE

pytestmark = pytest.mark.bwrap

PUBLIC_STYLE = Path(__file__).resolve().parent / "tasks" / "public_style"


async def run_trial(task: Path, agent: str, tmp_path: Path, **env_kwargs: object):
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"scratch_dir": str(tmp_path / "scratch"), **env_kwargs},
        ),
    )
    result = await (await Trial.create(config)).run()
    trial_dir = Path(result.trial_uri.removeprefix("file://"))
    log = trial_dir / "verifier" / "test-stdout.txt"
    return result, evidence_from_trial(result, "reward", log.read_text() if log.is_file() else "")


def variant(tmp_path: Path, name: str, test_sh: str) -> Path:
    task = tmp_path / name
    shutil.copytree(PUBLIC_STYLE, task)
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


async def test_the_standard_verifier_grades_a_right_solution_1_offline(tmp_path: Path) -> None:
    result, evidence = await run_trial(PUBLIC_STYLE, "oracle", tmp_path)
    assert evidence.discarded is None, evidence.detail
    assert evidence.reward == 1.0
    log = (Path(result.trial_uri.removeprefix("file://")) / "verifier" / "test-stdout.txt").read_text()
    assert "2 passed" in log, log  # the host's pytest really ran the task's tests
    assert "pytest-json-ctrf is not installed on the host: --ctrf dropped" in log


async def test_the_standard_verifier_grades_a_wrong_solution_0(tmp_path: Path) -> None:
    result, evidence = await run_trial(PUBLIC_STYLE, "nop", tmp_path)
    assert evidence.discarded is None, evidence.detail
    assert evidence.reward == 0.0
    log = (Path(result.trial_uri.removeprefix("file://")) / "verifier" / "test-stdout.txt").read_text()
    assert "2 failed" in log, log  # failed tests, not a broken verifier


STANDARD_HEAD = "#!/bin/bash\napt-get update\napt-get install -y curl\n"
REWARD_FROM_EXIT = (
    "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)


@pytest.mark.parametrize(
    ("name", "body", "why"),
    [
        (
            "missing_command",
            "no-such-grader-xyz /tests/test_outputs.py\n" + REWARD_FROM_EXIT,
            "missing command: no-such-grader-xyz is not on this host",
        ),
        (
            "missing_requirement",
            "uvx -p 3.12 -w pytest==8.4.1 -w no-such-plugin-xyz==1.0 pytest /tests/test_outputs.py\n"
            + REWARD_FROM_EXIT,
            "lacks no-such-plugin-xyz==1.0",
        ),
        (
            "network",
            "curl -fsS https://example.invalid/grader.py -o /tmp/grader.py\n"
            "uvx pytest /tests/test_outputs.py\n" + REWARD_FROM_EXIT,
            "network error: curl https://example.invalid/grader.py",
        ),
        (
            "apt_package",
            "apt-get install -y no-such-package-xyz\nuvx pytest /tests/test_outputs.py\n" + REWARD_FROM_EXIT,
            "the host lacks no-such-package-xyz",
        ),
        ("exit_before_reward", "set -e\nfalse\n" + REWARD_FROM_EXIT, "exited 1 before writing a reward file"),
    ],
)
async def test_a_verifier_that_cannot_run_is_discarded_as_verifier_error_never_scored(
    tmp_path: Path, name: str, body: str, why: str
) -> None:
    task = variant(tmp_path, name, STANDARD_HEAD + body)
    # The oracle solves the task: a 0 here could only come from the broken verifier.
    result, evidence = await run_trial(task, "oracle", tmp_path)
    assert evidence.discarded == "verifier_error", (evidence.reward, evidence.detail)
    assert evidence.reward is None or evidence.discarded
    assert why in evidence.detail
    assert "verifier log (end)" in evidence.detail
    assert result.exception_info.exception_type == "VerifierCannotRun"


async def test_a_problems_file_the_agent_left_behind_is_removed_before_the_verifier(tmp_path: Path) -> None:
    task = variant(tmp_path, "forged", (PUBLIC_STYLE / "tests" / "test.sh").read_text())
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho 'Hello, world!' > /app/greeting.txt\n"
        f"echo 'missing command: forged' > /logs/verifier/{PROBLEMS_FILE}\n"
    )
    _, evidence = await run_trial(task, "oracle", tmp_path)
    assert evidence.discarded is None, evidence.detail
    assert evidence.reward == 1.0
