"""The README's `uv run pytest --nbmake my.ipynb` runs a user's own notebook and fails on a cell that raises.

nbmake is in the dev group for this alone: the suite runs every notebook once under papermill
(tests/notebooks) and never passes --nbmake, so nbmake collects nothing there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts a second pytest and a Jupyter kernel: 10-20 s on two shared cores
def test_pytest_nbmake_runs_a_users_notebook(tmp_path: Path) -> None:
    assert "uv run pytest --nbmake" in (REPO / "README.md").read_text()
    cells = ["from pathlib import Path\nPath('ran.txt').write_text('yes')", "raise ValueError('cell two')"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "my.ipynb")

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbmake", "-p", "no:cacheprovider", "-q", "my.ipynb"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and "cell two" in done.stdout
    assert (tmp_path / "ran.txt").read_text() == "yes"  # the first cell ran in the notebook's own folder
