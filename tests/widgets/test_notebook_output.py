"""Saved notebooks hold the final state: a chart and a LiveRun updated live, run by papermill.

A kernel is started for real (papermill -> nbclient -> ipykernel), so this is the one slow-ish widget test
(a few seconds). Widget state is not stored: the static renderers must carry everything on their own.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from lab_sanitizer import stripped

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"

CURVE_CELL = """\
from loops_nb.run_events import StepRecord
from loops_nb.widgets import RunChart, in_kernel
assert in_kernel()
chart = RunChart()
live = chart.show()  # a live widget in a kernel
for step in range(n):
    chart.on_step(StepRecord(step, {"reward/mean": 0.1 * step, "reward/std": 0.05}))
    live.update()
live.finalize()
"""
LIVE_RUN_CELL = """\
import asyncio
from loops_nb.run_events import AttemptFinished, RunEnded, RunStarted, StepRollouts
from loops_nb.run_events import StepRecord
from loops_nb.widgets import LiveRun
stop = asyncio.Event()
run = LiveRun(stop_event=stop)
run.on_start(RunStarted(recipe="rl", model="tiny", max_steps=3, start_step=0))
for step in range(3):
    run.on_attempt(AttemptFinished(attempt=f"a{step}", task="t", reward=1.0, discarded=None, detail="", calls=1,
                                   policy_versions=[step], sampled_tokens=5, sequence_breaks={}, seconds=0.1,
                                   text={"calls": [{"prompt": "p", "completion": f"answer {step}", "trained": None}]}))
    run.on_rollouts(StepRollouts(step, [{"step": step, "group": 0, "attempt": f"a{step}", "trained": step != 1}]))
    run.on_step(StepRecord(step, {"reward/mean": 0.5 + 0.1 * step, "reward/std": 0.1, "tokens/sampled": 10,
                                  "tokens/trained": 5, "attempts": 1, "attempts/discarded": 0}))
    await asyncio.sleep(0.01)
run.on_end(RunEnded("completed", 3, 0.1))
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    pm = pytest.importorskip("papermill")
    tmp = tmp_path_factory.mktemp("nb")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("n = 2")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(CURVE_CELL), nbformat.v4.new_code_cell(LIVE_RUN_CELL)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, out = tmp / "curve.ipynb", tmp / "curve.out.ipynb"
    nbformat.write(nb, src)
    pm.execute_notebook(
        str(src),
        str(out),
        parameters={"n": 5},
        kernel_name="python3",
        cwd=str(tmp),
        progress_bar=False,
        execution_timeout=60,
        store_widget_state=True,  # papermill's default: every widget's last state goes into the notebook
    )
    return nbformat.read(out, as_version=4)


@pytest.mark.slow
def test_saved_curve_holds_the_final_state(executed: nbformat.NotebookNode) -> None:
    outputs = executed.cells[2].outputs  # [parameters, injected-parameters, curve, live run]
    assert [o.output_type for o in outputs] == ["display_data"]
    data = outputs[0].data
    assert data["text/plain"] == "reward: 5 steps, last 0.4, best 0.4"
    assert WIDGET not in data, "the live widget's output became the static figure"
    assert data["text/html"].count('title="step ') == 5
    figure = data[PLOTLY] if isinstance(data[PLOTLY], dict) else json.loads(data[PLOTLY])
    mean = next(t for t in figure["data"] if t["name"] == "reward/mean")
    assert mean["x"] == [1, 2, 3, 4, 5]  # records count from 0, the chart from 1
    assert mean["y"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


@pytest.mark.slow
def test_saved_live_run_holds_the_final_panel_and_no_dead_widget(executed: nbformat.NotebookNode) -> None:
    outputs = executed.cells[3].outputs
    displays = [o for o in outputs if o.output_type == "display_data"]
    assert len(displays) == 3 + 3  # the button's line, the panel, the chart, one output per trained step
    button, panel, chart, *steps = (o.data for o in displays)
    assert WIDGET not in button and button["text/plain"] == "run completed after 3 steps"
    # The live chart was a widget; the saved output is its static figure, with every step.
    assert WIDGET not in chart and chart["text/plain"].startswith("reward: 3 steps, last 0.7")
    figure = chart[PLOTLY] if isinstance(chart[PLOTLY], dict) else json.loads(chart[PLOTLY])
    mean = next(t for t in figure["data"] if t["name"] == "reward/mean")
    assert mean["x"] == [1, 2, 3] and mean["y"] == pytest.approx([0.5, 0.6, 0.7]) and mean["visible"]
    views = [b["label"] for b in figure["layout"]["updatemenus"][0]["buttons"]]
    assert views == ["reward", "tokens"]
    assert 'title="step 1:' in chart["text/html"], "the saved chart has its sanitizer-proof HTML"
    assert 'title="step 1:' not in panel["text/html"], "the panel leaves the chart to its own output"
    first = panel["text/plain"].splitlines()[0]
    assert "3/3 steps" in first and first.endswith("· 3 attempts · completed")
    assert "<details>" not in panel["text/html"]
    assert [s["text/plain"].split(":")[0] for s in steps] == ["step 1", "step 2", "step 3"]
    assert "answer 2" in steps[2]["text/html"] and steps[2]["text/html"].count("<details>") == 1
    assert ">ok · not trained<" in steps[1]["text/html"] and ">ok · trained<" in steps[0]["text/html"]
    for data in (button, panel, chart, *steps):  # reopened untrusted, nothing of it is lost
        assert stripped(data["text/html"]) == []
    # The closed widgets' states stay in the file (nbclient keeps them), but small: the live charts' plotly.js
    # bundle (5 MB) is dropped before they close.
    states = executed.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    assert len(json.dumps(states)) < 100_000, len(json.dumps(states))
