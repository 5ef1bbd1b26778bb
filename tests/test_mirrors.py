"""W&B mirroring (offline mode, no network) and the rich console region."""

from __future__ import annotations

import pytest

from loops_nb.mirrors import RichConsole, WandbMirror, run_observers
from loops_nb.observers import TerminalReporter
from loops_nb.run_events import EvalRecord, RunEnded, RunStarted, StepRecord


def test_wandb_mirror_logs_every_step_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    mirror = WandbMirror("loops-nb-test", {"recipe": "rl"})
    mirror.on_start(RunStarted(run_dir=str(tmp_path / "my-run")))
    for step in range(3):
        mirror.on_step(StepRecord(step, {"reward/mean": step / 3, "trained": True, "note": "x"}))
    mirror.on_end(RunEnded("completed", 3))
    history = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert history, "wandb wrote no offline run"


def test_wandb_mirror_logs_each_evaluation_at_its_step():
    class Recorder:
        def __init__(self):
            self.logged = []

        def log(self, values, step):
            self.logged.append((step, values))

    mirror = WandbMirror.__new__(WandbMirror)
    mirror._run = Recorder()
    mirror.on_eval(EvalRecord(4, {"eval/reward_mean": 0.75, "eval/pass_at_1": 0.5, "eval/tasks": 3}, 1.0))
    assert mirror._run.logged == [(4, {"eval/reward_mean": 0.75, "eval/pass_at_1": 0.5, "eval/tasks": 3.0})]


def test_rich_console_shows_the_latest_step(capsys):
    console = RichConsole()
    console.on_start(RunStarted("r", recipe="rl", model="m", scope="local", max_steps=2))
    console.on_step(StepRecord(0, {"reward/mean": 0.25}))
    console.on_step(StepRecord(1, {"reward/mean": 0.75}))
    console.on_end(RunEnded("completed"))
    out = capsys.readouterr().out
    assert "step 2/2" in out and "0.75" in out


def test_run_observers_default_to_the_output_section():
    from loops_nb.config.sections import OutputConfig

    assert [type(o) for o in run_observers(OutputConfig(), {})] == [TerminalReporter]
    assert isinstance(run_observers(OutputConfig(console=True), {})[0], RichConsole)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        kinds = [type(o).__name__ for o in run_observers(OutputConfig(wandb_project="p"), {})]
    assert kinds == ["TerminalReporter", "WandbMirror"]


def test_run_observers_add_wandb_to_the_callers_own():
    from loops_nb.config.sections import OutputConfig

    mine = object()
    assert run_observers(OutputConfig(), {}, [mine]) == [mine]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        kinds = [type(o).__name__ for o in run_observers(OutputConfig(wandb_project="p"), {}, [mine])]
    assert kinds == ["object", "WandbMirror"]
