"""RunChart: the views and their selector, the live FigureWidget's updates, reading a run back, and LiveRun's
chart output (live widget, then the static figure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from widget_fixtures import FakeDisplay, assert_static_html, rl_step

from loops_nb.errors import UserError
from loops_nb.run_events import EvalRecord, RunEnded, RunStarted
from loops_nb.step_record import StepRecord
from loops_nb.widgets import LiveRun, RunChart

PLOTLY = "application/vnd.plotly.v1+json"


def _rl_step(step: int) -> StepRecord:
    return rl_step(step, reward=0.2 * step).with_metrics(
        {"memory/rss_gb": 1.5 + 0.01 * step, "memory/peak_gb": 1.6}
    )


def _buttons(figure: dict[str, Any]) -> list[dict[str, Any]]:
    menus = figure["layout"].get("updatemenus") or [{"buttons": []}]
    return menus[0]["buttons"]


def test_views_and_selector_show_one_view_at_a_time() -> None:
    chart = RunChart("rl")
    for step in range(3):
        chart.on_step(_rl_step(step))
    figure = chart.to_plotly()
    buttons = _buttons(figure)
    assert [b["label"] for b in buttons] == ["reward", "KL", "entropy", "tokens", "timings", "memory"]
    names = [t["name"] for t in figure["data"]]
    # Only the first view is visible; each button shows exactly its own traces and names its axis.
    assert [t["name"] for t in figure["data"] if t["visible"]] == [
        "reward/mean high",
        "reward/mean low",
        "reward/mean",
    ]
    memory = next(b for b in buttons if b["label"] == "memory")
    shown = [n for n, v in zip(names, memory["args"][0]["visible"], strict=True) if v]
    assert shown == ["RSS (process tree)", "peak (this process)"]
    assert memory["args"][1] == {"yaxis.title.text": "GB resident"}
    rss = figure["data"][names.index("RSS (process tree)")]
    assert rss["x"] == [1, 2, 3] and rss["y"] == pytest.approx([1.5, 1.51, 1.52])
    assert rss["text"][0] == "step 1: RSS (process tree) 1.5"
    assert figure["layout"]["uirevision"], "a constant uirevision keeps zoom across updates"
    # Views with no data are left out of a static figure; the KL view has only v1 here.
    kl = next(b for b in buttons if b["label"] == "KL")
    assert [n for n, v in zip(names, kl["args"][0]["visible"], strict=True) if v] == ["kl v1 (mean Δlogprob)"]


def test_sft_views_and_the_eval_before_training() -> None:
    chart = RunChart()
    chart.on_eval(EvalRecord(0, {"eval/loss": 2.5}))
    for step in range(2):
        chart.on_step(
            StepRecord(
                step,
                {
                    "loss": 2.0 - step,
                    "learning_rate": 1e-3,
                    "optim/grad_norm": 0.5,
                    "tokens/trained": 10,
                    "tokens/total": 40,
                    "time/step_s": 3.0,
                    "memory/rss_gb": 1.9,
                },
            )
        )
    assert chart.recipe == "sft"
    figure = chart.to_plotly()
    labels = [b["label"] for b in _buttons(figure)]
    assert labels == ["loss", "grad norm", "learning rate", "tokens", "timings", "memory"]
    eval_loss = next(t for t in figure["data"] if t["name"] == "eval loss")
    assert eval_loss["x"][0] == 0 and eval_loss["y"][0] == 2.5, "the held-out loss before training is at 0"
    tokens = next(b for b in _buttons(figure) if b["label"] == "tokens")
    names = [t["name"] for t in figure["data"]]
    assert [n for n, v in zip(names, tokens["args"][0]["visible"], strict=True) if v] == [
        "in the batch",
        "trained",
    ]


def test_the_live_widget_keeps_its_traces_zoom_and_view_as_steps_arrive() -> None:
    chart = RunChart("rl")
    widget = chart.live_widget()
    assert widget is not None
    names = [t.name for t in widget.data]
    # Every view of the recipe from the start (empty until it has values): updates never add traces.
    assert {"reward/mean", "eval reward", "kl v2 (mean Δ²/2)", "RSS (process tree)"} <= set(names)
    widget.layout.xaxis.range = [1, 2]  # what a person's zoom leaves in the figure
    widget.data[names.index("reward/mean")].visible = False  # and a chosen view
    widget.data[names.index("RSS (process tree)")].visible = True
    for step in range(4):
        chart.on_step(_rl_step(step))
        chart.refresh(widget)
    chart.on_eval(EvalRecord(2, {"eval/reward_mean": 0.9}))
    chart.refresh(widget)
    assert [t.name for t in widget.data] == names
    rss = widget.data[names.index("RSS (process tree)")]
    assert list(rss.x) == [1, 2, 3, 4] and rss.visible is True
    assert widget.data[names.index("reward/mean")].visible is False
    assert list(widget.data[names.index("eval reward")].y) == [0.9]
    assert tuple(widget.layout.xaxis.range) == (1, 2)


def test_a_resumed_run_replaces_the_steps_it_logs_again() -> None:
    chart = RunChart("rl")
    for step in (0, 1, 2, 1, 2):  # resumed from the checkpoint at 1
        chart.on_step(_rl_step(step))
    assert [r.step for r in chart.records] == [0, 1, 2]


def test_from_run_reads_steps_and_evals(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"recipe": "rl", "model": "m"}))
    (run / "steps.jsonl").write_text(
        "".join(json.dumps(_rl_step(s).to_json()) + "\n" for s in range(3)) + '{"step": 3, "re'
    )
    (run / "evals.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.1}) + "\n")
    chart = RunChart.from_run(run)
    bundle = chart._repr_mimebundle_()
    assert (
        bundle["text/plain"].startswith("reward: 3 steps, last 0.4")
        and "memory 1.52 GB" in bundle["text/plain"]
    )
    assert_static_html(bundle["text/html"])
    eval_trace = next(t for t in bundle[PLOTLY]["data"] if t["name"] == "eval reward")
    assert eval_trace["x"] == [0] and eval_trace["y"] == [0.1]
    with pytest.raises(UserError, match="not a run directory"):
        RunChart.from_run(tmp_path)


def test_live_run_shows_the_live_chart_and_saves_the_static_figure() -> None:
    shows = FakeDisplay()
    live = LiveRun(display_fn=shows, live_chart=True, heartbeat_s=0)
    live.on_start(RunStarted(recipe="rl", max_steps=2, start_step=0))
    widget = shows.handles[-1].obj
    assert type(widget).__name__ == "FigureWidget"
    assert 'title="step' not in live.to_html(), "the panel leaves the curve to the chart"
    for step in range(2):
        live.on_step(_rl_step(step))
    assert list(next(t for t in widget.data if t.name == "reward/mean").y) == pytest.approx([0.0, 0.2])
    live.on_end(RunEnded("completed", steps=2))
    final = shows.handles[-1].last
    assert isinstance(final, RunChart), "the widget's output becomes the static figure"
    assert PLOTLY in final._repr_mimebundle_()


def test_without_a_live_chart_the_panel_draws_the_curve() -> None:
    shows = FakeDisplay()
    live = LiveRun(display_fn=shows, heartbeat_s=0)  # a display_fn frontend: no widget assumed
    live.on_start(RunStarted(recipe="rl", max_steps=2, start_step=0))
    live.on_step(_rl_step(0))
    assert all(type(h.obj).__name__ != "FigureWidget" for h in shows.handles)
    assert 'title="step 1:' in live.to_html()
