"""Comparing runs from their directories: the runs table (status, last reward, eval, wall time), the legend from
what differs in the saved configs, overlaid curves in all three renderers, and `loops runs`."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from lab_sanitizer import stripped

from loops_nb.cli import main
from loops_nb.errors import UserError
from loops_nb.runs_table import read_run, read_runs
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_compare import compare_runs, default_metrics
from loops_nb.widgets.series import metric_definition


def make_run(
    root: Path,
    name: str,
    *,
    lr: float,
    steps: int,
    max_steps: int = 4,
    final: bool = True,
    failed: bool = False,
    evals: bool = True,
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {
        "recipe": "rl",
        "model": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "lora_rank": 8},
        "training": {"learning_rate": lr, "max_steps": max_steps, "group_size": 4},
        "output": {"run_name": name, "output_dir": str(root)},
    }
    (run / "run.json").write_text(
        json.dumps(
            {"recipe": "rl", "model": config["model"]["base_model"], "config": config, "started": 1000.0}
        )
    )
    lines = []
    for step in range(steps):
        line = {"step": step, "reward/mean": lr * 10 * step, "reward/std": 0.1, "loss": 1.0 / (step + 1)}
        if evals and step % 2 == 1:
            # As the RL evaluation logs it: measures, and counts and a spread that are not curves.
            line |= {
                "eval/reward_mean": lr * 5 * step,
                "eval/reward_std": 0.2,
                "eval/pass_at_4": 1.0,
                "eval/attempts": 8,
                "eval/policy_version": step,
                "eval/tokens_sampled": 64,
            }
        line["time"] = 1000.0 + 30.0 * (step + 1)
        lines.append(json.dumps(line))
    (run / "steps.jsonl").write_text("".join(line + "\n" for line in lines))
    if final:
        sampler = f"bt://loops:r-{name}/sampler_weights/final-{steps:06d}"
        checkpoint = {
            "step": steps,
            "path": f"bt://loops:r-{name}/weights/state-{steps:06d}",
            "sampler_path": sampler,
        }
        (run / "checkpoints.jsonl").write_text(json.dumps(checkpoint) + "\n")
    log = "Config: x.toml\n" + ("failed: step 2: the trainer went away\nTraceback ...\n" if failed else "")
    (run / "run.log").write_text(log)
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    make_run(tmp_path, "a-lr1e-3", lr=1e-3, steps=4)
    make_run(tmp_path, "b-lr1e-2", lr=1e-2, steps=4)
    make_run(tmp_path, "c-stopped", lr=1e-2, steps=2, evals=False)
    make_run(tmp_path, "d-failed", lr=3e-2, steps=2, final=False, failed=True)
    make_run(tmp_path, "e-killed", lr=3e-2, steps=1, final=False)
    return tmp_path


def test_the_table_reads_status_reward_eval_and_wall_time_from_the_files(runs: Path) -> None:
    table = read_runs(runs / "*")
    assert [r.name for r in table] == ["a-lr1e-3", "b-lr1e-2", "c-stopped", "d-failed", "e-killed"]
    assert [r.status for r in table] == ["completed", "completed", "stopped", "failed", "incomplete"]
    b = table[1].row()
    assert b["steps"] == "4/4" and b["last reward"] == pytest.approx(0.3)
    assert (b["eval metric"], b["eval"]) == ("eval/reward_mean", pytest.approx(0.15))
    assert b["wall"] == pytest.approx(120.0)
    assert table[2].row()["eval"] is None
    # Steps logged without a time (RL): the wall time runs to the last write of the logs.
    lines = (runs / "b-lr1e-2" / "steps.jsonl").read_text().splitlines()
    untimed = [json.dumps({k: v for k, v in json.loads(line).items() if k != "time"}) for line in lines]
    (runs / "b-lr1e-2" / "steps.jsonl").write_text("".join(line + "\n" for line in untimed))
    os.utime(runs / "b-lr1e-2" / "steps.jsonl", (1500.0, 1500.0))
    os.utime(runs / "b-lr1e-2" / "checkpoints.jsonl", (1400.0, 1400.0))
    assert read_run(runs / "b-lr1e-2").wall_seconds == pytest.approx(500.0)
    text = "\n".join(table.describe())
    assert "b-lr1e-2" in text and "0.15 (reward_mean)" in text and "2m00s" in text
    assert "differs: training.learning_rate 0.001 | 0.01 | 0.01 | 0.03 | 0.03" in text


def test_a_run_whose_lock_is_held_is_running(runs: Path) -> None:
    run = runs / "e-killed"
    (run / "state").mkdir()
    fd = os.open(run / "state" / "run.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert read_run(run).status == "running"
    finally:
        os.close(fd)
    assert read_run(run).status == "incomplete"


def test_the_legend_names_what_differs_and_only_that(runs: Path) -> None:
    two = read_runs([runs / "a-lr1e-3", runs / "b-lr1e-2"])
    assert two.differences() == {"training.learning_rate": [1e-3, 1e-2]}
    assert two.labels() == ["learning_rate=0.001", "learning_rate=0.01"]
    # Runs alike in every setting that matters are told apart by their names.
    same = read_runs([runs / "b-lr1e-2", runs / "c-stopped"])
    assert same.labels() == ["b-lr1e-2", "c-stopped"]


def test_curves_overlay_every_run_per_metric_in_three_renderers(runs: Path) -> None:
    comparison = compare_runs(str(runs / "a-*"), str(runs / "b-*"))
    assert default_metrics(comparison.runs) == ["reward/mean", "loss", "eval/reward_mean", "eval/pass_at_4"]
    series = comparison.series("eval/reward_mean")
    assert [s.name for s in series] == ["learning_rate=0.001", "learning_rate=0.01"]
    assert list(series[1].xs) == [1, 3] and list(series[1].ys) == pytest.approx([0.05, 0.15])
    # A run's curve is the one its own chart draws: steps numbered from 1, an eval at the steps before it.
    chart = RunChart.from_run(runs / "b-lr1e-2")
    for key in ("reward/mean", "eval/reward_mean"):
        points = chart.points(metric_definition(key, chart.kind))
        assert (list(comparison.series(key)[1].xs), list(comparison.series(key)[1].ys)) == (
            list(points),
            list(points.values()),
        )
    assert list(comparison.series("reward/mean")[1].xs) == [1, 2, 3, 4]
    bundle = comparison._repr_mimebundle_()
    assert "learning_rate=0.01" in bundle["text/plain"] and "eval/reward_mean:" in bundle["text/plain"]
    html = bundle["text/html"]
    assert stripped(html) == [], "JupyterLab's sanitizer would strip part of the saved view"
    assert "<svg" not in html and "learning_rate=0.001" in html and "eval after 3 steps: reward 0.15" in html
    figure = bundle["application/vnd.plotly.v1+json"]
    import plotly.graph_objects as go

    go.Figure(figure)  # a valid figure
    # The table first (live JupyterLab shows only the figure of the bundle), then two runs in four panels.
    table, *curves = figure["data"]
    assert table["type"] == "table" and table["cells"]["values"][0] == ["a-lr1e-3", "b-lr1e-2"]
    assert table["cells"]["values"][-1] == ["learning_rate=0.001", "learning_rate=0.01"]
    assert len(curves) == 8 and sum(t["showlegend"] for t in curves) == 2
    assert figure["layout"]["yaxis3"]["title"]["text"] == "eval/reward_mean"


def test_refresh_sees_new_steps_and_new_runs(runs: Path) -> None:
    comparison = compare_runs(str(runs / "*-lr*"))
    assert len(comparison.runs) == 2
    make_run(runs, "f-lr5e-2", lr=5e-2, steps=3, final=False)
    with (runs / "a-lr1e-3" / "steps.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "reward/mean": 0.9, "time": 1200.0}) + "\n")
    comparison.refresh()
    assert [r.name for r in comparison.runs][-1] == "f-lr5e-2"
    assert comparison.runs[0].last("reward/mean") == 0.9


def test_loops_runs_prints_the_table_and_refuses_what_is_not_a_run(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(runs / "*")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "name",
        "recipe",
        "model",
        "steps",
        "status",
        "last",
        "reward",
        "eval",
        "wall",
    ]
    assert "d-failed" in out and "failed" in out
    assert main(["runs", str(runs)]) == 0  # a folder of runs
    assert "e-killed" in capsys.readouterr().out
    assert main(["runs", str(runs / "nothing-*")]) == 2
    assert "matches no run directory" in capsys.readouterr().err
    (runs / "empty").mkdir()
    with pytest.raises(UserError, match="not a run directory"):
        read_run(runs / "empty")
