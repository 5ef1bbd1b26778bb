"""The run comparison in a real browser: JupyterLab draws the runs table and every run's points in the plotly panels, with the legend
built from what differs between the runs' configs (the saved, sanitized HTML is checked in
tests/widgets/test_run_compare.py and by the papermill run of notebooks/compare_runs.ipynb)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyterlab_driver import Console, Expect, LabServer
from test_jupyterlab import run_and_check, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = [
    "# Parameters\nsteps = 4",
    "import json, tempfile\nfrom pathlib import Path\nfrom loops_nb.widgets import compare_runs\n\n"
    "root = Path(tempfile.mkdtemp())\n"
    "for lr in (0.001, 0.01):\n"
    "    run = root / f'lr{lr}'\n"
    "    run.mkdir()\n"
    "    config = {'training': {'learning_rate': lr, 'max_steps': steps}, 'output': {'run_name': run.name}}\n"
    "    (run / 'run.json').write_text(json.dumps({'recipe': 'rl', 'model': 'm', 'config': config, 'started': 0}))\n"
    "    lines = [{'step': s, 'reward/mean': lr * 10 * s, 'time': 10.0 * (s + 1)} for s in range(steps)]\n"
    "    for line in lines[1::2]:\n"
    "        line['eval/reward_mean'] = lr * 5 * line['step']\n"
    "    (run / 'steps.jsonl').write_text(''.join(json.dumps(x) + '\\n' for x in lines))",
    "comparison = compare_runs(str(root / '*'))\ncomparison",
    "print('compare:', comparison.labels())",
]


@pytest.mark.timeout(300)
def test_the_comparison_draws_every_run_in_plotly_with_the_legend_of_what_differs(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.cells[0].metadata["tags"] = ["parameters"]
    source = lab_root / "_run_compare.ipynb"
    nbformat.write(nb, source)
    name = write_notebook(source, lab_root / "run_compare.ipynb", {})
    expect = Expect(
        texts=(
            "compare: ['learning_rate=0.001', 'learning_rate=0.01']",
            "learning_rate=0.01",
            "incomplete",
        ),  # the table's status column
        plotly_points=2 * 4 + 2 * 2,  # reward/mean at every step, eval/reward_mean at steps 1 and 3, per run
    )
    problems = run_and_check(
        page, console, lab_server, name, expect, artifacts_dir, label="run_compare", timeout_s=180
    )
    assert not problems, "\n".join(problems)
