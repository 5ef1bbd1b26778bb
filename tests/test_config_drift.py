"""A resume with a changed config: fixed settings are refused with what to do, others are listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loops_nb import load
from loops_nb.cli import main
from loops_nb.config_drift import config_changes, resume_drift
from loops_nb.errors import ConfigError

QUICKSTART = (
    Path(__file__).resolve().parents[1] / "patterns/custom_runtime/in_process_direct/train_local.toml"
)


def dump(**overrides) -> dict:
    return json.loads(load(QUICKSTART, overrides=overrides).config.model_dump_json())


def test_a_new_run_or_an_unchanged_config_has_no_drift() -> None:
    config = dump()
    assert resume_drift("rl", None, config, "runs/x") == []
    assert resume_drift("rl", {"recipe": "rl", "run_id": "r"}, config, "runs/x") == []  # no config recorded
    assert resume_drift("rl", {"recipe": "rl", "config": config}, config, "runs/x") == []


def test_where_the_files_go_is_not_a_change() -> None:
    changes = config_changes(dump(), dump(**{"output.output_dir": "elsewhere", "output.trace": "samples"}))
    assert changes == {}


def test_allowed_changes_are_listed_with_old_and_new_values() -> None:
    started = dump()
    now = dump(
        **{"training.max_steps": 20, "training.learning_rate": 1e-3, "runtime.options.answer": "chess"}
    )
    lines = resume_drift("rl", {"recipe": "rl", "config": started}, now, "runs/x")
    assert "changed since the run started: training.max_steps = 20 (was 8)" in lines
    assert "changed since the run started: training.learning_rate = 0.001 (was 0.002)" in lines
    assert 'changed since the run started: runtime.options.answer = "chess" (was "monopoly")' in lines
    assert len(lines) == 3


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("model.lora_rank", 8, "model.lora_rank = 16 (this config: 8)"),
        ("training.seed", 3, "training.seed = 0 (this config: 3)"),
        ("training.group_size", 4, "training.group_size = 16 (this config: 4)"),
        ("runtime.factory", "other:Episode", 'runtime.factory = "episode:HiddenGame"'),
        ("eval.holdout", 0.5, "eval.holdout = 0.0 (this config: 0.5)"),
    ],
)
def test_a_fixed_setting_that_changed_is_refused(key: str, value: object, shown: str) -> None:
    with pytest.raises(ConfigError) as refused:
        resume_drift("rl", {"recipe": "rl", "config": dump()}, dump(**{key: value}), "runs/x")
    message = str(refused.value)
    assert message.startswith("runs/x was started with ") and shown in message
    assert "--output.run_name" in message


def test_eval_settings_other_than_the_holdout_may_change_and_a_run_from_before_eval_resumes() -> None:
    lines = resume_drift("rl", {"recipe": "rl", "config": dump()}, dump(**{"eval.attempts": 8}), "runs/x")
    assert "changed since the run started: eval.attempts = 8 (was 16)" in lines
    before_eval = dump()
    del before_eval["eval"]  # a run.json written before [eval] existed: its holdout was 0
    lines = resume_drift("rl", {"recipe": "rl", "config": before_eval}, dump(), "runs/x")  # not refused
    assert not any("eval.holdout" in line for line in lines)
    with pytest.raises(ConfigError, match="eval.holdout"):
        resume_drift("rl", {"recipe": "rl", "config": before_eval}, dump(**{"eval.holdout": 0.5}), "runs/x")


def test_an_sft_run_directory_cannot_be_resumed_as_rl() -> None:
    with pytest.raises(ConfigError, match="runs/x holds a sft run; this config is rl"):
        resume_drift("rl", {"recipe": "sft", "config": {}}, dump(), "runs/x")


def test_loops_run_refuses_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "run.json").write_text(
        json.dumps({"recipe": "rl", "run_id": "r1", "config": dump(**{"model.lora_rank": 8})})
    )
    code = main(
        ["run", str(QUICKSTART), "--output.output_dir", str(tmp_path / "runs"), "--output.run_name", "mine"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.lora_rank = 8 (this config: 16)" in err and str(run) in err
    assert len(err.strip().splitlines()) == 1
    assert not (run / "state").exists() and not (run / "run.log").exists(), "nothing was started"
    assert json.loads((run / "run.json").read_text())["run_id"] == "r1", "the run's record is untouched"
