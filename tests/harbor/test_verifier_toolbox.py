"""The offline stand-ins the local sandbox puts on its verifier's PATH, run directly (no sandbox).

What each does is in loops_nb/providers/verifier_toolbox/toolbox.py; the sandboxed end-to-end runs are in
test_public_style_verifier.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loops_nb.providers.local_verifier import TOOLBOX


@pytest.fixture
def shell(tmp_path: Path):
    problems = tmp_path / "problems.txt"

    def run(command: str) -> tuple[int, str, list[str]]:
        env = {
            "PATH": f"{TOOLBOX / 'bin'}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "LOOPS_NB_HOST_PYTHON": sys.executable,
            "LOOPS_NB_SANDBOX_NETWORK": "none",
            "LOOPS_NB_VERIFIER_PROBLEMS": str(problems),
        }
        done = subprocess.run(
            ["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        lines = problems.read_text().splitlines() if problems.exists() else []
        problems.unlink(missing_ok=True)
        return done.returncode, done.stdout + done.stderr, lines

    return run


def test_uvx_runs_the_hosts_pytest_and_notes_another_version_than_the_pin(shell) -> None:
    code, out, problems = shell("uvx -p 3.12 -w pytest==0.0.1 pytest --version")
    assert code == 0 and problems == [], out
    assert "pytest==0.0.1 asked for, the host's pytest" in out
    assert "pytest " in out  # pytest's own version line
    assert shell("uvx --from 'pytest>=1' pytest --version")[0] == 0
    assert shell("uv run --with pytest pytest --version")[0] == 0
    assert shell("uv tool run pytest --version")[0] == 0


def test_a_requirement_the_host_lacks_is_a_recorded_problem(shell) -> None:
    code, _, problems = shell("uvx -w no-such-plugin-xyz pytest --version")
    assert code != 0
    assert len(problems) == 1 and "lacks no-such-plugin-xyz" in problems[0]
    assert "(`uv add --dev no-such-plugin-xyz`)" in problems[0], "the fix names what is missing"
    assert shell("uvx no-such-tool-xyz")[2] != []


def test_installs_succeed_only_when_the_host_has_everything(shell) -> None:
    assert shell("uv init && uv venv && uv add pytest && uv pip install pytest && pip install pytest")[
        :3:2
    ] == (0, [])
    code, _, problems = shell("uv add no-such-package-xyz")
    assert code != 0 and "lacks no-such-package-xyz" in problems[0]


def test_uvs_installer_installs_nothing_and_its_env_file_can_be_sourced(shell, tmp_path: Path) -> None:
    code, out, problems = shell(
        "curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh && source $HOME/.local/bin/env"
    )
    assert code == 0 and problems == [], out
    assert (tmp_path / ".local" / "bin" / "env").is_file()


def test_apt_get_succeeds_for_what_the_host_has_and_records_the_rest(shell) -> None:
    assert shell("apt-get update && apt-get install -y --no-install-recommends bash")[:3:2] == (0, [])
    code, _, problems = shell("apt-get install -y no-such-package-xyz")
    assert code == 100 and "the host lacks no-such-package-xyz" in problems[0]


def test_nothing_is_recorded_without_a_problems_file(tmp_path: Path) -> None:
    env = {"PATH": f"{TOOLBOX / 'bin'}:{os.environ['PATH']}", "LOOPS_NB_HOST_PYTHON": sys.executable}
    done = subprocess.run(["uvx", "no-such-tool-xyz"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and list(tmp_path.iterdir()) == []


def test_check_names_the_requirement_a_verifier_lacks_in_its_fix(tmp_path: Path) -> None:
    """harbor-cookbook's verifiers run `uvx -w pytest-xdist pytest -n 2`: the fix must say pytest-xdist."""
    from loops_nb.providers.local_verifier import verifier_warnings

    script = tmp_path / "test.sh"
    script.write_text(
        "#!/bin/bash\nuvx -p 3.12 -w pytest==8.4.1 -w no-such-xdist-xyz==3.8.0 pytest -n 2 /tests\n"
    )
    (warning,) = verifier_warnings("multi_reward", script, network=False)
    assert "runs uvx with no-such-xdist-xyz==3.8.0" in warning
    assert warning.endswith("(install them there: `uv add --dev no-such-xdist-xyz`)")
