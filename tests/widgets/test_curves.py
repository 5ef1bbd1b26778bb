"""RewardCurve and LossCurve: three renderers of the same points."""

from __future__ import annotations

import json
import re

import pytest
from widget_fixtures import FakeDisplay, assert_static_html

from loops_nb.step_record import StepRecord
from loops_nb.widgets import LossCurve, RewardCurve
from loops_nb.widgets.svg_chart import Series, dot_chart, sparkline, svg_chart

PLOTLY = "application/vnd.plotly.v1+json"
REWARDS = [0.1, 0.3, 0.25, 0.5, 0.6, 0.55, 0.75, 0.72]


def reward_curve(n: int = 8) -> RewardCurve:
    curve = RewardCurve()
    for step, reward in enumerate(REWARDS[:n]):
        curve.on_step(StepRecord(step, {"reward/mean": reward, "reward/std": 0.1}))
    return curve


def trace(bundle: dict, name: str) -> dict:
    figure = json.loads(json.dumps(bundle[PLOTLY]))  # what the frontend receives
    return next(t for t in figure["data"] if t.get("name") == name)


def test_reward_curve_three_renderers() -> None:
    curve = reward_curve()
    bundle = curve._repr_mimebundle_()
    assert bundle["text/plain"] == "reward: 8 steps, last 0.72, best 0.75"
    assert "\n" not in bundle["text/plain"]
    assert repr(curve) == f"<RewardCurve: {bundle['text/plain']}>"

    html = bundle["text/html"]
    assert_static_html(html, svg=True)  # the SVG is for nbconvert; Lab shows the plotly JSON
    assert html.count("<circle") == 8
    titles = re.findall(r"<title>([^<]*)</title>", html)
    assert titles[0] == "step 1: reward/mean 0.1 ± 0.1"  # records count from 0, the panel from 1
    assert "<polygon" in html  # the ± std band
    assert ">step</text>" in html and ">reward/mean</text>" in html  # axis labels

    mean = trace(bundle, "reward/mean")
    assert mean["x"] == list(range(1, 9))
    assert mean["y"] == REWARDS
    high = trace(bundle, "reward/mean high")
    assert high["y"][0] == REWARDS[0] + 0.1


def test_reward_curve_minmax_spread_and_resume() -> None:
    curve = RewardCurve(spread="minmax")
    for step in range(5):
        curve.on_step(StepRecord(step, {"reward/mean": step / 10, "reward/min": 0.0, "reward/max": 1.0}))
    curve.on_step(
        StepRecord(3, {"reward/mean": 0.9, "reward/min": 0.5, "reward/max": 1.0})
    )  # resumed at step 3
    assert curve.steps == [1, 2, 3, 4]
    assert curve.last == 0.9
    assert "[0.5, 1]" in curve.to_svg()


def test_empty_curve_renders() -> None:
    curve = RewardCurve()
    bundle = curve._repr_mimebundle_()
    assert bundle["text/plain"] == "reward: 0 steps, last -, best -"
    assert "<svg" in bundle["text/html"] and PLOTLY not in bundle


def test_loss_curve_train_and_eval() -> None:
    curve = LossCurve()
    for step in range(10):
        record = {"loss": 2.0 - 0.1 * step, "learning_rate": 1e-4, "tokens/trained": 100}
        if step % 4 == 0:
            record["eval/loss"] = 2.1 - 0.05 * step
        curve.on_step(StepRecord(step, record))
    bundle = curve._repr_mimebundle_()
    assert bundle["text/plain"] == "loss: 10 steps, last 1.1, eval 1.7 at step 9, best eval 1.7"
    html = bundle["text/html"]
    assert_static_html(html, svg=True)
    assert html.count("<circle") == 10 + 3
    assert 'stroke-dasharray="5,3"' in html  # eval is dashed
    assert trace(bundle, "train loss")["y"][-1] == 1.1
    eval_y = trace(bundle, "eval loss")["y"]
    assert [y for y in eval_y if y is not None] == pytest.approx([2.1, 1.9, 1.7])


def test_show_returns_a_live_display(fake_display: FakeDisplay) -> None:
    curve = RewardCurve()
    live = curve.show(display_fn=fake_display)
    for step in range(5):
        curve.add(step, 0.1 * step, std=0.05)
        live.update()
    live.finalize()
    handle = fake_display.handles[0]
    assert handle.last is curve and handle.last._repr_mimebundle_()["text/html"].count("<circle") == 5


def test_many_points_thin_the_circles_not_the_line() -> None:
    xs = list(range(1000))
    series = [Series("s", xs, [float(x % 7) for x in xs])]
    svg = svg_chart(series, max_points=100)
    assert 100 <= svg.count("<circle") <= 101
    assert svg.count(",") > 1000  # every point is on the polyline


def test_dot_chart_uses_only_sanitizer_safe_markup() -> None:
    html = reward_curve().to_dot_chart()
    assert_static_html(html)
    assert "<svg" not in html and "<circle" not in html
    assert html.count("border-radius:50%") == 8
    assert 'title="step 8: reward/mean 0.72 ± 0.1"' in html


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([None, 1.0]) == "▁"
    assert dot_chart([]).startswith("<div")


def test_a_one_step_chart_never_labels_a_negative_step() -> None:
    from loops_nb.widgets.svg_chart import Series, dot_chart

    html = dot_chart([Series("reward/mean", [0.0], [0.5])])
    assert "step -1" not in html and "step 0" in html
