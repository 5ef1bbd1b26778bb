"""The RL eval curve: `[eval]` rewards beside the training reward, live (`on_eval`) and replayed from steps.jsonl."""

from __future__ import annotations

import io
import re

from widget_fixtures import FakeDisplay, assert_static_html

from loops_nb.run_events import EvalRecord, RunEnded, RunStarted
from loops_nb.step_record import StepRecord
from loops_nb.widgets import LiveRun, RewardCurve
from loops_nb.widgets.reward_curve import EVAL_COLOR


def _events(live: LiveRun) -> None:
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
    live.on_end(RunEnded("completed", steps=4, seconds=1.0))


def test_the_eval_series_joins_the_reward_curve(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)
    _events(live)
    assert isinstance(live.curve, RewardCurve)
    assert live.curve.eval_steps == [0, 2, 4], "an evaluation seen twice (event and record) is one point"
    assert live.curve.eval_means == [0.0, 0.4, 0.9]
    assert live.curve.last_eval == (4, 0.9)
    names = [s.name for s in live.curve.series()]
    assert names == ["reward/mean", "eval reward"]
    html = fake_display.handles[0].last.to_html()
    assert_static_html(html)
    assert len(re.findall(r'title="eval after \d+ steps: reward', html)) == 3
    assert EVAL_COLOR in live.curve.to_svg()


def test_a_curve_replayed_from_steps_jsonl_has_the_eval_points_its_records_carry() -> None:
    curve = RewardCurve()
    for step in range(3):
        curve.on_step(
            StepRecord(step, {"reward/mean": 0.5, **({"eval/reward_mean": 0.25} if step != 1 else {})})
        )
    assert curve.eval_steps == [0, 2]
    assert "eval reward" in [s.name for s in curve.series()]
    assert "eval reward" not in [s.name for s in RewardCurve().series()]


def test_script_mode_prints_each_evaluation() -> None:
    out = io.StringIO()
    live = LiveRun(mode="text", stream=out)
    _events(live)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("eval after")]
    assert lines[0] == "eval after 0 steps: reward_mean=0  tasks=3  attempts=6"
    assert lines[-1].startswith("eval after 4 steps: reward_mean=0.9")
