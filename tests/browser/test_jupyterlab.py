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
import contextlib
import json
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
    publish_docs_images,
    run_all,
    save_artifacts,
    snapshot,
)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The same tiny runs as tests/notebooks/test_notebooks.py's SMOKE (no base-vs-adapter comparison here).
# Three steps: a transcript opened when step 1's attempts appear must stay open over the two steps after it.
QUICKSTART = {"max_steps": 3, "group_size": 2, "groups_per_step": 2, "max_tokens": 8, "eval_attempts": 2}
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
    during: Any = None,
) -> list[str]:
    """Open ``name``, Run All, save the evidence, and return the checker's problems. ``during(page)`` also
    runs at every poll while the cells run."""
    open_notebook(page, server, name)
    seen: set[str] = set()

    def poll(p: Any) -> None:
        seen.update(p.evaluate(_BUTTONS_JS))
        if during is not None:
            during(p)

    prompts = run_all(page, timeout_s=timeout_s, during=poll)
    facts = page_facts(page)
    save_artifacts(page, artifacts, label, facts, console)
    return check_outputs(facts, console, prompts, expect, seen_buttons=seen)


# -- the notebooks ------------------------------------------------------------------------------------------


# The live panel's header ("RL · model · 1/3 steps · …") and the first transcript (a <details> in a step's
# attempts output): opened once, by a click on its row, then watched. A re-render replaces the element, so
# `isConnected` turns false; a re-render that kept the element would still have closed it.
_TRANSCRIPT_JS = r"""
() => {
  const outs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const header = (outs.map(o => o.textContent).find(t => /^(RL|SFT) · /.test(t.trim())) || '').trim();
  const steps = /(\d+)\/(\d+) steps/.exec(header);
  if (!window.__opened) {
    const row = document.querySelector('.jp-OutputArea-output details summary');
    if (row) { row.click(); window.__opened = row.parentElement; window.__openedAt = steps ? +steps[1] : null; }
  }
  const d = window.__opened;
  return {opened: !!d, at: window.__openedAt ?? null, connected: d ? d.isConnected : null,
          open: d ? d.open : null, done: steps ? +steps[1] : null, header: header.slice(0, 160)};
}
"""


@pytest.mark.timeout(780)
def test_rl_quickstart_draws_the_reward_curve_and_an_open_transcript_stays_open(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    name = repo_notebook("rl_quickstart.ipynb", lab_root, QUICKSTART)
    expect = Expect(
        texts=("check: ok", "status: completed", "reward/mean: step 1 ="),
        plotly_points=QUICKSTART["max_steps"],  # the RunChart under the panel: live widget, then static
        widget_buttons=("Stop",),
    )
    watched: list[dict[str, Any]] = []
    live_shot = artifacts_dir / "rl_quickstart-live.png"
    live_shot.unlink(missing_ok=True)

    def during(p: Any) -> None:
        watched.append(p.evaluate(_TRANSCRIPT_JS))
        done = watched[-1]["done"]
        if done and 1 <= done < QUICKSTART["max_steps"] and not live_shot.is_file():  # mid-run, for the docs
            snapshot(p, ".jp-OutputArea:has(.js-plotly-plot)", live_shot)

    try:
        problems = run_and_check(
            page,
            console,
            lab_server,
            name,
            expect,
            artifacts_dir,
            label="rl_quickstart",
            timeout_s=600,
            during=during,
        )
        watched.append(page.evaluate(_TRANSCRIPT_JS))
    finally:  # what the watched transcript did, also when the run timed out
        (artifacts_dir / "rl_quickstart-transcript.json").write_text(json.dumps(watched, indent=1))
    publish_docs_images(artifacts_dir, {"rl_quickstart-live.png": "live_panel.png"})
    assert not problems, "\n".join(problems)
    opened = [w for w in watched if w["opened"]]
    assert opened, f"no transcript row ever appeared: {watched[-1]}"
    closed = [w for w in opened if not (w["connected"] and w["open"])]
    assert not closed, f"the opened transcript was replaced or closed: {closed[0]}"
    total = QUICKSTART["max_steps"]
    assert opened[0]["at"] is not None and opened[0]["at"] <= total - 2, opened[0]
    assert opened[-1]["done"] == total, f"watched until {opened[-1]}"


@pytest.mark.timeout(600)
def test_sft_notebook_previews_trained_and_masked_tokens_and_its_panel_moves_before_step_1(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    name = repo_notebook("sft_tool_use.ipynb", lab_root, SFT)
    expect = Expect(
        texts=("rows read: 4", "status: completed", "train loss: first", "eval before training"),
        plotly_points=SFT["max_steps"] + 1,  # train loss, and the held-out loss before training
        target_preview=True,
        widget_buttons=("Stop",),
    )
    headers: list[str] = []
    problems = run_and_check(
        page,
        console,
        lab_server,
        name,
        expect,
        artifacts_dir,
        label="sft_tool_use",
        timeout_s=420,
        during=lambda p: headers.append(p.evaluate(_TRANSCRIPT_JS)["header"]),
    )
    publish_docs_images(artifacts_dir, {"sft_tool_use-preview.png": "sft_target_preview.png"})
    assert not problems, "\n".join(problems)
    # Before step 1 ends (the pre-training eval, the first batch) the heartbeat re-renders the header.
    before = sorted({h for h in headers if "0/1 steps" in h})
    assert len(before) >= 2, f"the panel did not move before step 1: {before}"
    assert any("step 1 running for" in h for h in before), before


# -- the live chart: zoom and the chosen view survive updates -------------------------------------------------

LIVE_CHART_CELLS = [
    "# Parameters\nwait_s = 20",
    "import asyncio\nfrom loops_nb.run_events import StepRecord\nfrom loops_nb.widgets import RunChart\n"
    "chart = RunChart('rl')\nlive = chart.show()\n"
    "def feed(steps):\n"
    "    for step in steps:\n"
    "        chart.on_step(StepRecord(step, {'reward/mean': 0.1 * step, 'reward/std': 0.05, 'tokens/sampled': 10 + step}))\n"
    "        live.update()\n"
    "feed(range(3))",
    # Meanwhile the page zooms and picks the tokens view (`during`); then three more steps arrive.
    "await asyncio.sleep(wait_s)\nfeed(range(3, 6))\nawait asyncio.sleep(2)\nprint('fed: 6 steps')",
]

_LIVE_PLOT_JS = r"""
(act) => {
  const gd = document.querySelector('.jp-OutputArea .js-plotly-plot');
  if (!gd || !gd.data) return null;
  if (act && !window.__zoomed) {
    window.__zoomed = true;
    window.Plotly.relayout(gd, {'xaxis.range': [1.5, 5.5]});
  }
  const shown = gd.data.filter(t => t.visible === true && (t.x || []).length > 0);
  return {zoomed: !!window.__zoomed, range: gd.layout.xaxis.range, views: shown.map(t => t.name),
          xs: shown.map(t => (t.x || []).length), ytitle: (gd.querySelector('.ytitle') || {}).textContent};
}
"""


@pytest.mark.timeout(300)
def test_the_live_chart_keeps_zoom_and_view_across_updates(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in LIVE_CHART_CELLS]
    nb.cells[0].metadata["tags"] = ["parameters"]
    source = lab_root / "_live_chart.ipynb"
    nbformat.write(nb, source)
    name = write_notebook(source, lab_root / "live_chart.ipynb", {})
    before: list[Any] = []

    def during(p: Any) -> None:
        facts = p.evaluate(_LIVE_PLOT_JS, False)
        if facts and facts["xs"] and facts["xs"][-1] >= 3 and not before:  # drawn with its first 3 steps
            p.locator(".js-plotly-plot .updatemenu-button", has_text="tokens").first.click(force=True)
            p.wait_for_timeout(300)
            before.append(p.evaluate(_LIVE_PLOT_JS, True))

    expect = Expect(texts=("fed: 6 steps",), plotly_points=3)
    problems = run_and_check(
        page,
        console,
        lab_server,
        name,
        expect,
        artifacts_dir,
        label="live_chart",
        timeout_s=120,
        during=during,
    )
    after = page.evaluate(_LIVE_PLOT_JS, False)
    assert not problems, "\n".join(problems)
    assert before and before[0]["views"] == ["sampled"], f"the tokens view was not chosen mid-run: {before}"
    assert after["views"] == ["sampled"] and after["ytitle"] == "tokens per step", after
    assert after["xs"] == [6], f"the updates did not reach the live figure: {after}"
    assert after["range"] == [1.5, 5.5], f"the zoom was lost: {after}"


# -- the checker can fail -----------------------------------------------------------------------------------

GALLERY_CELLS = [
    "# Parameters\npoints = 3\ntrained = True\nshow_button = True",
    "import ipywidgets\nfrom IPython.display import HTML, display\n"
    "from loops_nb.run_events import StepRecord\nfrom loops_nb.widgets import RunChart, TargetPreview, TokenSequence",
    # The chart live, as LiveRun shows it: a LiveFigure widget, fed step by step (plotly draws its points).
    "chart = RunChart('rl')\nlive = chart.show()\nfor step in range(points):\n"
    "    chart.on_step(StepRecord(step, {'reward/mean': 0.2 * step, 'reward/std': 0.05}))\n    live.update()",
    # What the saved chart shows where no JavaScript runs: its table, a hover text per point.
    "HTML(chart.to_html())",
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


# -- a papermill-saved notebook, reopened: untrusted, so JupyterLab sanitizes every HTML output ---------------

SAVED_CELLS = [
    "# Parameters\nsteps = 3",
    # A live run fed the events RLRun sends (attempts, then the step's rollouts rows, then the step).
    "import asyncio\nfrom loops_nb.widgets import LiveRun\n"
    "from loops_nb.run_events import AttemptFinished, RunEnded, RunStarted, StepRollouts\n"
    "from loops_nb.run_events import StepRecord\n"
    "live = LiveRun(stop_event=asyncio.Event())\nlive.show()\n"
    "live.on_start(RunStarted('runs/x', recipe='rl', model='tiny', max_steps=steps, start_step=0))\n"
    "for step in range(steps):\n"
    "    ids = [f'hidden-monopoly/g{g}/a{a}' for g in range(2) for a in range(2 + 9 * g)]\n"
    "    for n, i in enumerate(ids):\n"
    "        live.on_attempt(AttemptFinished(attempt=i, task='hidden-monopoly' if n % 2 else 'q', reward=n / 7,\n"
    "                        discarded='timeout' if n == 3 else None, detail='', calls=1, policy_versions=[step],\n"
    "                        sampled_tokens=10 ** (n % 4), sequence_breaks={}, seconds=0.5 * n,\n"
    "                        text={'calls': [{'prompt': 'p', 'completion': f'answer {n}', 'trained': None}]}))\n"
    "    live.on_rollouts(StepRollouts(step, [{'step': step, 'group': int(i.split('/g')[1][0]), 'attempt': i,\n"
    "                                          'trained': n % 2 == 0} for n, i in enumerate(ids)]))\n"
    "    live.on_step(StepRecord(step, {'reward/mean': 0.2 * step, 'reward/std': 0.1, 'tokens/sampled': 40,\n"
    "                                   'tokens/trained': 20, 'attempts': len(ids), 'attempts/discarded': 1}))\n"
    "    await asyncio.sleep(0.01)\n"
    "live.on_end(RunEnded('completed', steps))",
    # The negative control: the old layout (columns sized in ch), which the sanitizer collapses.
    "from IPython.display import HTML\n"
    "cell = lambda t: f'<span style=\"display:inline-block;width:22ch;overflow:hidden\">{t}</span>'\n"
    "HTML('<div class=\"loops-ch-control\">' + ''.join(\n"
    "    f'<div>{cell(a)}{cell(b)}{cell(\"x\")}</div>' for a, b in [('#', 'task'), ('hidden-monopoly/g0/a1', 'q')]\n"
    ") + '</div>')",
]

# x positions of the cells of every attempts row (and header) per step output, and of the control's rows.
_COLUMNS_JS = r"""
() => {
  const xs = row => [...row.children].filter(e => e.tagName === 'SPAN')
                      .map(e => Math.round(e.getBoundingClientRect().left));
  const blocks = [...document.querySelectorAll('.jp-OutputArea-output')]
    .filter(o => /^step \d+: \d+ attempts/.test(o.textContent.trim()))
    .map(o => ({header: xs([...o.querySelectorAll('div')].find(
                  d => d.firstElementChild && d.firstElementChild.getAttribute('title') === 'step')),
                rows: [...o.querySelectorAll('details > summary')].map(xs)}));
  const control = [...document.querySelectorAll('.loops-ch-control > div')].map(xs);
  const outs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const plot = document.querySelector('.jp-OutputArea .js-plotly-plot');  // the output node is the plot
  const chart = plot && {
    points: [...plot.querySelectorAll('.scatterlayer .point')].filter(e => e.getBoundingClientRect().width > 0).length,
    views: [...plot.querySelectorAll('.updatemenu-button')].map(b => b.textContent),
    ytitle: (plot.querySelector('.ytitle') || {}).textContent,
  };
  return {blocks, control, chart, text: outs.map(o => o.textContent).join('\n')};
}
"""


def _aligned(rows: list[list[int]]) -> bool:
    return all(len(r) == len(rows[0]) for r in rows) and all(
        max(col) - min(col) <= 1 for col in zip(*rows, strict=True)
    )


@pytest.mark.timeout(300)
def test_a_saved_notebook_reopened_untrusted_keeps_the_attempts_columns(
    lab_page: tuple[Any, Console], lab_server: LabServer, lab_root: Path, artifacts_dir: Path
) -> None:
    page, console = lab_page
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in SAVED_CELLS]
    nb.cells[0].metadata["tags"] = ["parameters"]
    source, saved = lab_root / "_saved_panel.ipynb", lab_root / "saved_panel.ipynb"
    nbformat.write(nb, source)
    pm.execute_notebook(  # an unsigned output: Lab opens it untrusted, as it opens every papermill output
        str(source),
        str(saved),
        kernel_name="python3",
        cwd=str(lab_root),
        progress_bar=False,
        store_widget_state=False,
    )
    open_notebook(page, lab_server, saved.name)  # opened, not run: what a person reopening it sees
    page.wait_for_timeout(1_000)
    with contextlib.suppress(
        Exception
    ):  # plotly.js loads on first use; the assertions below say what is missing
        page.wait_for_selector(".jp-OutputArea .js-plotly-plot .scatterlayer .point", timeout=15_000)
    facts = page.evaluate(_COLUMNS_JS)
    page.screenshot(path=str(artifacts_dir / "saved_panel.png"))
    snapshot(page, ".jp-OutputArea:has(.js-plotly-plot)", artifacts_dir / "saved_panel-outputs.png")
    publish_docs_images(artifacts_dir, {"saved_panel-outputs.png": "saved_panel.png"})
    assert len(facts["blocks"]) == 3, facts
    for block in facts["blocks"]:
        header = block["header"]
        assert len(header) == 10 and header == sorted(set(header)), f"header columns run together: {header}"
        assert len(block["rows"]) == 13 and _aligned(block["rows"]), f"rows misaligned: {block['rows'][:3]}"
        assert block["rows"][0] == sorted(set(block["rows"][0]))
    chart = facts["chart"]
    assert chart and chart["points"] >= 3, f"the run's chart is not drawn: {chart}"
    assert chart["views"] == ["reward", "tokens"] and chart["ytitle"] == "reward/mean", chart
    # Its view selector works without a kernel: the tokens view replaces the reward's axis and points.
    page.locator(".js-plotly-plot .updatemenu-button", has_text="tokens").first.click(force=True)
    page.wait_for_timeout(500)
    switched = page.evaluate(_COLUMNS_JS)["chart"]
    assert switched["ytitle"] == "tokens per step" and switched["points"] >= 3, switched
    assert "3/3 steps" in facts["text"] and "run completed after 3 steps" in facts["text"]
    # The sanitizer ran: the control's ch widths were dropped, so its columns no longer line up.
    assert len(facts["control"]) == 2 and not _aligned(facts["control"]), facts["control"]
    assert not console.errors, console.errors[:5]
