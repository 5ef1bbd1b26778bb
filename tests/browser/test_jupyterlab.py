"""The notebooks in a real browser: JupyterLab on loopback, headless Chromium, Run All, then the rendered DOM.

Headless runs (papermill, nbmake) prove the cells run; only a browser proves the outputs *render*: the reward
curve's points are drawn, the SFT target preview colours trained and masked tokens, the Stop button's widget
loads, and nothing says "Loading widget" or logs a JavaScript error. The quickstart and SFT notebooks run with
tiny parameters (papermill's own injection writes the copies the server serves).

The negative controls run the same checker on a small notebook of the same widgets, once healthy and twice
broken (the widget and plotly front ends blocked; the outputs hollow), so a checker that passes everything
would fail here. Screenshots, output text and console logs go to tests/browser/artifacts/ (or
$LOOPS_NB_ARTIFACTS/browser).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat
import papermill as pm
import pytest
from jupyterlab_driver import (
    Console,
    Expect,
    LabServer,
    check_outputs,
    open_notebook,
    page_facts,
    run_all,
    save_artifacts,
)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The same tiny runs as tests/notebooks/test_notebooks.py's SMOKE (no base-vs-adapter comparison here).
QUICKSTART = {"max_steps": 2, "group_size": 4, "groups_per_step": 2, "max_tokens": 8}
SFT = {"max_steps": 1, "max_rows": 4, "eval_examples": 2, "compare_rows": 0}

_BUTTONS_JS = (
    "() => [...document.querySelectorAll('.jp-OutputArea button.jupyter-button')]"
    ".filter(b => b.getBoundingClientRect().width > 0).map(b => b.textContent.trim())"
)


def write_notebook(src: Path, dest: Path, parameters: dict[str, Any]) -> str:
    """Copy ``src`` to ``dest`` with ``parameters`` injected after its parameters cell (papermill's
    ``prepare_only``: the injection of a batch run, without running anything)."""
    pm.execute_notebook(str(src), str(dest), parameters=parameters, prepare_only=True, kernel_name="python3")
    return dest.name


def repo_notebook(name: str, lab_root: Path, parameters: dict[str, Any]) -> str:
    """A parameterised copy of notebooks/``name``; its config made absolute (the kernel runs in lab_root)."""
    src = NOTEBOOKS / name
    defaults = pm.inspect_notebook(str(src))
    params = dict(parameters)
    params["config"] = str(REPO / ast.literal_eval(defaults["config"]["default"]))
    params["run_name"] = f"browser-{src.stem}"
    return write_notebook(src, lab_root / name, params)


def run_and_check(
    page: Any,
    console: Console,
    server: LabServer,
    name: str,
    expect: Expect,
    artifacts: Path,
    *,
    label: str,
    timeout_s: float,
) -> list[str]:
    """Open ``name``, Run All, save the evidence, and return the checker's problems."""
    open_notebook(page, server, name)
    seen: set[str] = set()
    prompts = run_all(page, timeout_s=timeout_s, during=lambda p: seen.update(p.evaluate(_BUTTONS_JS)))
    facts = page_facts(page)
    save_artifacts(page, artifacts, label, facts, console)
    return check_outputs(facts, console, prompts, expect, seen_buttons=seen)


# -- the notebooks ------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_rl_quickstart_draws_the_reward_curve(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    name = repo_notebook("rl_quickstart.ipynb", lab_root, QUICKSTART)
    expect = Expect(
        texts=("check: ok", "status: completed", "reward/mean: step 1 ="),
        reward_points=QUICKSTART["max_steps"],
        widget_buttons=("Stop",),
    )
    problems = run_and_check(
        page, console, lab_server, name, expect, artifacts_dir, label="rl_quickstart", timeout_s=420
    )
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(600)
def test_sft_notebook_previews_trained_and_masked_tokens(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    name = repo_notebook("sft_tool_use.ipynb", lab_root, SFT)
    expect = Expect(
        texts=("rows read: 4", "status: completed", "train loss: first"),
        loss_points=SFT["max_steps"],
        target_preview=True,
        widget_buttons=("Stop",),
    )
    problems = run_and_check(
        page, console, lab_server, name, expect, artifacts_dir, label="sft_tool_use", timeout_s=420
    )
    assert not problems, "\n".join(problems)


# -- the checker can fail -----------------------------------------------------------------------------------

GALLERY_CELLS = [
    "# Parameters\npoints = 3\ntrained = True\nshow_button = True",
    "import ipywidgets\nfrom IPython.display import HTML, display\n"
    "from loops_nb.widgets import RewardCurve, TargetPreview, TokenSequence",
    # The curve's own bundle: plotly JSON in Lab (jupyterlab-plotly), SVG elsewhere.
    "curve = RewardCurve()\nfor step in range(points):\n    curve.add(step, 0.2 * step, std=0.05)\ncurve",
    # The same curve as LiveRun draws it (positioned dots).
    "HTML(curve.to_dot_chart())",
    "class CharTokenizer:\n"
    "    def decode(self, ids, skip_special_tokens=False):\n"
    "        return ''.join(map(chr, ids))\n\n"
    "text = 'user: the capital of France?\\nassistant: Paris'\n"
    "answer = len(text) - len('Paris')\n"
    "weights = [0.0] * answer + [1.0 if trained else 0.0] * (len(text) - answer)\n"
    "TargetPreview(TokenSequence([ord(c) for c in text], weights, 'by hand'), CharTokenizer())",
    "if show_button:\n    display(ipywidgets.Button(description='Stop', button_style='danger'))",
    "print('gallery: done')",
]
GALLERY_EXPECT = Expect(
    texts=("gallery: done",),
    reward_points=3,
    plotly_points=3,
    target_preview=True,
    widget_buttons=("Stop",),
)


def gallery(lab_root: Path, name: str, **parameters: Any) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in GALLERY_CELLS]
    nb.cells[0].metadata["tags"] = ["parameters"]
    source = lab_root / f"_{name}"
    nbformat.write(nb, source)
    return write_notebook(source, lab_root / name, parameters)


def test_checker_passes_the_healthy_gallery(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    """The positive control: the gallery the negative controls break renders cleanly as it is."""
    page, console = lab_page
    name = gallery(lab_root, "gallery_healthy.ipynb")
    problems = run_and_check(
        page, console, lab_server, name, GALLERY_EXPECT, artifacts_dir, label="gallery_healthy", timeout_s=120
    )
    assert not problems, "\n".join(problems)


def test_checker_fails_when_the_widget_frontend_is_blocked(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    """Negative control: the ipywidgets manager and plotly's renderer never reach the browser."""
    page, console = lab_page
    for extension in ("@jupyter-widgets", "jupyterlab-plotly"):
        page.context.route(f"**/lab/extensions/{extension}/**", lambda route: route.abort())
    name = gallery(lab_root, "gallery_blocked.ipynb")
    problems = run_and_check(
        page, console, lab_server, name, GALLERY_EXPECT, artifacts_dir, label="gallery_blocked", timeout_s=120
    )
    report = "\n".join(problems)
    for expected in (
        "widget button 'Stop' never rendered",
        "output shows 'Button('",  # Lab's fallback without the widget manager: the widget's Python repr
        "plotly drew 0 points",
        "console errors",
    ):
        assert expected in report, report


def test_checker_fails_when_the_outputs_are_hollow(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    """Negative control: a curve without points, a preview where nothing trains, no button."""
    page, console = lab_page
    name = gallery(lab_root, "gallery_hollow.ipynb", points=0, trained=False, show_button=False)
    problems = run_and_check(
        page, console, lab_server, name, GALLERY_EXPECT, artifacts_dir, label="gallery_hollow", timeout_s=120
    )
    report = "\n".join(problems)
    for expected in (
        "reward curve drew 0 points",
        "plotly drew 0 points",
        "target preview lacks trained or masked tokens",
        "widget button 'Stop' never rendered",
    ):
        assert expected in report, report
