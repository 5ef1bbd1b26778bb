"""The wheel ships the patterns, examples (Harbor tasks included), data and notebooks: `loops check
examples/...` works from any directory in a fresh environment, and a file at that path there wins.

Slow (about two minutes on a loaded machine, most of it the check loading the model): it builds the wheel,
installs it with uv into a new virtual environment (from uv's cache, which the project's own sync filled)
and runs the installed `loops` from an empty temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/sft_tool_use/sft_local.toml"
pytestmark = pytest.mark.slow


def uv() -> str:
    # uv sits beside the base interpreter (.ci/run puts it there), which a project venv does not have on PATH.
    found = shutil.which("uv") or str(Path(sys._base_executable).parent / "uv")
    assert Path(found).is_file(), "the wheel test needs uv (`python3 -m pip install uv`, as .ci/run does)"
    return found


def run(
    *args: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with only the wheel (and its dependencies) installed: its bin/."""
    root = tmp_path_factory.mktemp("wheel")
    built = run(uv(), "build", "--wheel", "-o", root / "dist")
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("loops_nb-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "loops_nb/_shipped/" + EXAMPLE,
        "loops_nb/_shipped/examples/tool_agent/tasks/count_lines/tests/test.sh",
        "loops_nb/_shipped/patterns/harbor/tasks/hidden_game/task.toml",
        "loops_nb/_shipped/notebooks/rl_quickstart.ipynb",
        "loops_nb/providers/verifier_toolbox/bin/uvx",
    ):
        assert shipped in names, f"the wheel lacks {shipped}"
    assert not [n for n in names if "__pycache__" in n or "/runs/" in n], "ignored files were packaged"
    mode = zipfile.ZipFile(wheel).getinfo("loops_nb/providers/verifier_toolbox/bin/uvx").external_attr >> 16
    assert mode & 0o111, "the verifier's offline tools must stay executable"
    venv = root / "venv"
    made = run(uv(), "venv", "-q", "-p", "python3.12", venv)
    assert made.returncode == 0, made.stderr
    added = run(uv(), "pip", "install", "-q", "--python", venv / "bin" / "python", wheel)
    assert added.returncode == 0, added.stderr
    return venv / "bin"


def test_loops_check_of_a_shipped_example_works_from_any_directory(
    installed: Path, tmp_path: Path, smollm2_path: Path, model_cache_dir: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"LOOPS_NB_CACHE": str(model_cache_dir), "HF_HUB_OFFLINE": "1"}
    checked = run(installed / "loops", "check", EXAMPLE, cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    header = checked.stdout.splitlines()[0]
    shipped = installed.parent / "lib" / "python3.12" / "site-packages" / "loops_nb" / "_shipped" / EXAMPLE
    assert header.startswith(f"Config: {tmp_path / EXAMPLE} -> {shipped}"), header
    assert "the copy shipped with loops_nb" in header
    assert checked.stdout.splitlines()[-1] == "check: ok"
    assert not (tmp_path / "examples").exists(), "the check wrote nothing beside the user's files"

    # A file at that path in the working directory wins, and the header names it alone.
    mine = tmp_path / EXAMPLE
    mine.parent.mkdir(parents=True)
    mine.write_text('recipe = "sft"\n[model]\nbase_model = 7\n')
    local = run(installed / "loops", "check", EXAMPLE, cwd=tmp_path, env=env)
    assert local.returncode != 0
    assert f"{mine}" in local.stdout + local.stderr and "site-packages" not in local.stdout + local.stderr
