"""RunChart: one chart for a run's curve and metrics; its renderers (text, plotly, the table for frontends without
JavaScript), the views and their selector, the evaluations, the live figure's updates, reading a run back, and
LiveRun's chart output (live widget, then the static figure)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from widget_fixtures import FakeDisplay, assert_static_html, rl_step

from loops_nb.errors import UserError
from loops_nb.run_events import EvalRecord, RunEnded, RunStarted, StepRecord
from loops_nb.widgets import LiveRun, RunChart
from loops_nb.widgets.live_figure import _ESM
from loops_nb.widgets.series import CURVES, EVAL_COLOR, curve_kind, series_table
from loops_nb.widgets.style import sparkline

PLOTLY = "application/vnd.plotly.v1+json"
REWARDS = [0.1, 0.3, 0.25, 0.5, 0.6, 0.55, 0.75, 0.72]


def reward_chart(n: int = 8) -> RunChart:
    chart = RunChart()
    for step, reward in enumerate(REWARDS[:n]):
        chart.on_step(StepRecord(step, {"reward/mean": reward, "reward/std": 0.1}))
    return chart


def trace(bundle: dict, name: str) -> dict:
    figure = json.loads(json.dumps(bundle[PLOTLY]))  # what the frontend receives
    return next(t for t in figure["data"] if t.get("name") == name)


def _rl_step(step: int) -> StepRecord:
    return rl_step(step, reward=0.2 * step).with_metrics(
        {"memory/rss_gb": 1.5 + 0.01 * step, "memory/peak_gb": 1.6}
    )


def _buttons(figure: dict[str, Any]) -> list[dict[str, Any]]:
    menus = figure["layout"].get("updatemenus") or [{"buttons": []}]
    return menus[0]["buttons"]


def test_the_curve_kind_is_decided_in_one_place() -> None:
    assert curve_kind("rl") == "reward" and curve_kind("sft") == "loss"
    assert curve_kind(keys={"loss", "reward/mean"}) == "reward", "an RL step may log a loss too"
    assert curve_kind(keys={"eval/loss"}) == "loss" and curve_kind(keys={"tokens/total"}) is None
    chart = RunChart()
    chart.on_step(StepRecord(0, {"tokens/total": 3}))
    assert chart.kind is None and chart.summary() == "no steps yet"
    chart.on_step(StepRecord(1, {"loss": 2.0}))
    assert chart.kind == "loss"


def test_reward_chart_three_renderers() -> None:
    chart = reward_chart()
    bundle = chart._repr_mimebundle_()
    assert bundle["text/plain"] == "reward: 8 steps, last 0.72, best 0.75"
    assert repr(chart) == f"<RunChart: {bundle['text/plain']}>"
    assert str(chart).endswith(sparkline(REWARDS))

    html = bundle["text/html"]
    assert_static_html(html)  # the table survives Lab's sanitizer, nbconvert and GitHub
    titles = re.findall(r'title="([^"]*)"', html)
    assert (
        len(titles) == 8 and titles[0] == "step 1: reward/mean 0.1 ± 0.1"
    )  # records count from 0, the chart from 1

    mean = trace(bundle, "reward/mean")
    assert mean["x"] == list(range(1, 9))
    assert mean["y"] == REWARDS
    assert mean["text"][0] == titles[0]
    assert trace(bundle, "reward/mean high")["y"][0] == pytest.approx(REWARDS[0] + 0.1)
    assert bundle[PLOTLY]["layout"]["xaxis"]["rangemode"] == "tozero", "never a negative step"


def test_minmax_spread_and_resume() -> None:
    chart = RunChart(spread="minmax")
    for step in range(5):
        chart.on_step(StepRecord(step, {"reward/mean": step / 10, "reward/min": 0.0, "reward/max": 1.0}))
    chart.on_step(
        StepRecord(3, {"reward/mean": 0.9, "reward/min": 0.5, "reward/max": 1.0})
    )  # resumed at step 3
    assert [r.step + 1 for r in chart.records] == [1, 2, 3, 4]
    assert chart.summary().startswith("reward: 4 steps, last 0.9")
    assert "[0.5, 1]" in chart.to_html()


def test_an_empty_chart_renders() -> None:
    bundle = RunChart("rl")._repr_mimebundle_()
    assert bundle["text/plain"] == "reward: 0 steps, last -, best -"
    assert "<table" in bundle["text/html"] and PLOTLY not in bundle


def test_loss_chart_train_and_eval() -> None:
    chart = RunChart()
    for step in range(10):
        metrics = {"loss": 2.0 - 0.1 * step, "learning_rate": 1e-4, "tokens/trained": 100}
        if step % 4 == 0:
            metrics["eval/loss"] = 2.1 - 0.05 * step
        chart.on_step(StepRecord(step, metrics))
    bundle = chart._repr_mimebundle_()
    assert bundle["text/plain"] == "loss: 10 steps, last 1.1, eval 1.7 at step 9, best eval 1.7"
    html = bundle["text/html"]
    assert_static_html(html)
    assert len(re.findall(r'title="step \d+: train loss', html)) == 10
    assert len(re.findall(r'title="eval after \d+ steps: loss', html)) == 3
    assert trace(bundle, "train loss")["y"][-1] == pytest.approx(1.1)
    evaluation = trace(bundle, "eval loss")
    assert evaluation["y"] == pytest.approx([2.1, 1.9, 1.7]) and evaluation["line"]["dash"] == "dash"


def test_many_steps_thin_the_table_not_the_figure() -> None:
    chart = RunChart("sft")
    for step in range(1000):
        chart.on_step(StepRecord(step, {"loss": float(step % 7)}))
    assert 40 <= chart.to_html().count("<tr>") - 1 <= 41
    assert 'title="step 1000: train loss' in chart.to_html(), "the last step is always a row"
    assert len(trace(chart._repr_mimebundle_(), "train loss")["x"]) == 1000
    assert series_table([]).startswith("<div")


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([None, 1.0]) == "▁"


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
    import plotly.graph_objects as go

    go.Figure(figure)  # a valid figure


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
    assert chart.kind == "loss"
    figure = chart.to_plotly()
    labels = [b["label"] for b in _buttons(figure)]
    assert labels == ["loss", "grad norm", "learning rate", "tokens", "timings", "memory"]
    eval_loss = next(t for t in figure["data"] if t["name"] == "eval loss")
    assert eval_loss["x"][0] == 0 and eval_loss["y"][0] == 2.5, "the held-out loss before training is at 0"
    assert eval_loss["text"][0] == "eval before training: loss 2.5"
    assert "eval before training 2.5" in chart.summary()
    tokens = next(b for b in _buttons(figure) if b["label"] == "tokens")
    names = [t["name"] for t in figure["data"]]
    assert [n for n, v in zip(names, tokens["args"][0]["visible"], strict=True) if v] == [
        "in the batch",
        "trained",
    ]


def _rl_events(live: LiveRun) -> None:
    live.on_start(RunStarted(run_dir="runs/fake", recipe="rl", model="tiny", scope="local", max_steps=4))
    for step in range(4):
        metrics = {"reward/mean": 0.1 * step, "reward/std": 0.05}
        if step % 2 == 0:  # the eval of the policy this step sampled, as RLRun puts it in the record
            metrics |= {"eval/reward_mean": 0.2 * step, "eval/pass_at_1": 0.1}
            live.on_eval(
                EvalRecord(step, {"eval/reward_mean": 0.2 * step, "eval/tasks": 3, "eval/attempts": 6})
            )
        live.on_step(StepRecord(step, metrics))
    live.on_eval(
        EvalRecord(4, {"eval/reward_mean": 0.9, "eval/tasks": 3, "eval/attempts": 6})
    )  # the final policy
    live.on_end(RunEnded(status="completed", steps=4, seconds=1.0))


def test_the_eval_reward_joins_the_reward_curve(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)
    _rl_events(live)
    evaluation = CURVES["reward"].metrics[1]
    assert live.chart.points(evaluation) == {0: 0.0, 2: 0.4, 4: 0.9}, "an evaluation seen twice is one point"
    assert "eval 0.9 at step 4, best eval 0.9" in live.chart.summary()
    assert [s.name for s in live.chart.curve()] == ["reward/mean", "eval reward"]
    _panel, chart = fake_display.handles
    assert chart.last is live.chart
    html = chart.last.to_html()
    assert_static_html(html)
    assert len(re.findall(r'title="eval (after \d+ steps|before training): reward', html)) == 3
    assert trace(chart.last._repr_mimebundle_(), "eval reward")["line"]["color"] == EVAL_COLOR


def test_a_chart_replayed_from_steps_jsonl_has_the_eval_points_its_records_carry() -> None:
    chart = RunChart()
    for step in range(3):
        chart.on_step(
            StepRecord(step, {"reward/mean": 0.5, **({"eval/reward_mean": 0.25} if step != 1 else {})})
        )
    assert list(chart.points(CURVES["reward"].metrics[1])) == [0, 2]
    assert "eval reward" in [s.name for s in chart.curve()]
    assert "eval reward" not in [s.name for s in RunChart("rl").curve()]


def test_script_mode_prints_each_evaluation() -> None:
    out = io.StringIO()
    live = LiveRun(mode="text", stream=out)
    _rl_events(live)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("eval after")]
    assert lines[0] == "eval after 0 steps: reward_mean=0  tasks=3  attempts=6"
    assert lines[-1].startswith("eval after 4 steps: reward_mean=0.9")


def test_the_live_figure_keeps_its_traces_and_sends_only_values() -> None:
    shows = FakeDisplay()
    chart = RunChart("rl")
    live = chart.show(display_fn=shows, live=True)
    widget = shows.handles[-1].obj
    assert (
        type(widget).__name__ == "LiveFigure"
        and repr(widget) == f"LiveFigure({len(widget.figure['data'])} traces)"
    )
    first = widget.figure
    names = [t["name"] for t in first["data"]]
    # Every view of the curve kind from the start (empty until it has values): updates never add traces.
    assert {"reward/mean", "eval reward", "kl v2 (mean Δ²/2)", "RSS (process tree)"} <= set(names)
    for step in range(4):
        chart.on_step(_rl_step(step))
        live.update()
    chart.on_eval(EvalRecord(2, {"eval/reward_mean": 0.9}))
    live.update()
    figure = widget.figure
    assert [t["name"] for t in figure["data"]] == names
    # The view re-plots only x, y and text (Plotly.restyle) while the traces stay the same: a person's zoom,
    # pan and chosen view are never sent over; the figure's visibility and layout stay as first drawn.
    assert [t["visible"] for t in figure["data"]] == [t["visible"] for t in first["data"]]
    assert figure["layout"]["uirevision"] == first["layout"]["uirevision"]
    assert 'Plotly.restyle(el, { x: pick("x"), y: pick("y"), text: pick("text") }' in _ESM
    rss = figure["data"][names.index("RSS (process tree)")]
    assert rss["x"] == [1, 2, 3, 4]
    assert figure["data"][names.index("eval reward")]["y"] == [0.9]
    live.finalize()
    assert shows.handles[-1].last is chart, "the widget's output becomes the static figure"
    assert widget.plotly_js == "", "plotly.js leaves the widget's state before it closes"


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
    assert type(widget).__name__ == "LiveFigure"
    assert 'title="step' not in live.to_html(), "the panel leaves the curve to the chart"
    for step in range(2):
        live.on_step(_rl_step(step))
    assert next(t for t in widget.figure["data"] if t["name"] == "reward/mean")["y"] == pytest.approx(
        [0.0, 0.2]
    )
    live.on_end(RunEnded(status="completed", steps=2))
    final = shows.handles[-1].last
    assert final is live.chart, "the widget's output becomes the static figure"
    assert PLOTLY in final._repr_mimebundle_()
    outputs = len(shows.handles)
    live.finalize()  # what every notebook does after project.train(...), whose on_end finalized already
    assert len(shows.handles) == outputs, "a second finalize shows nothing new"


def test_without_a_live_chart_the_static_chart_is_re_rendered_under_the_panel() -> None:
    shows = FakeDisplay()
    live = LiveRun(display_fn=shows, heartbeat_s=0, max_hz=0)  # a display_fn frontend: no widget assumed
    live.on_start(RunStarted(recipe="rl", max_steps=2, start_step=0))
    live.on_step(_rl_step(0))
    _panel, chart = shows.handles
    assert chart.obj is live.chart and chart.updates >= 1
    assert 'title="step 1:' in chart.obj.to_html() and 'title="step 1:' not in live.to_html()
