"""Every mistake in a config or an episode module is one `loops: error:` line naming what to fix, never a
traceback; strict config types; `loops check` warns about settings that cannot train."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_config import rl_config_toml

from loops_nb import load
from loops_nb.cli import main
from loops_nb.rl.recipe import cannot_train
from loops_nb.run.check_report import RecipeCheckReport

CONFIG = rl_config_toml("episode:Game")
GAME = """
from loops_nb.episodes import Episode

class Game(Episode):
    def tasks(self):
        return ["t"]

    async def run(self, task):
        return 1.0
"""


def one_error_line(capsys: pytest.CaptureFixture[str], args: list[str], code: int = 2) -> str:
    assert main(args) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def project(tmp_path: Path, episode: str = GAME, config: str = CONFIG) -> Path:
    (tmp_path / "episode.py").write_text(episode)
    path = tmp_path / "train.toml"
    path.write_text(config + f'[output]\noutput_dir = "{tmp_path / "runs"}"\n')
    return path


def test_a_config_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "train.toml"
    path.write_bytes(CONFIG.encode() + b"# caf\xe9\n")
    line = one_error_line(capsys, ["check", str(path)])
    assert f"{path}: not UTF-8 text (byte 0xe9" in line


def test_an_output_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path)
    (tmp_path / "taken").write_text("a file")
    line = one_error_line(capsys, ["run", str(config), "--output.output_dir", str(tmp_path / "taken")])
    assert f"{tmp_path / 'taken'} is a file; set output.output_dir to a directory" in line


@pytest.mark.parametrize(
    ("episode", "needle"),
    [
        (
            "raise RuntimeError('needs a GPU')\n",
            "importing module 'episode' raised RuntimeError: needs a GPU (episode.py:1)",
        ),
        ("import sys\nsys.exit(3)\n", "importing module 'episode' called sys.exit(3)"),
        (
            GAME + "    def __init__(self):\n        raise ValueError('no tasks file')\n",
            "constructing it raised ValueError: no tasks file (episode.py:",
        ),
        (
            GAME + "    def __init__(self):\n        len(3)\n",
            "constructing it raised TypeError: object of type 'int' has no len()",
        ),
    ],
)
def test_an_episode_module_or_constructor_that_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], episode: str, needle: str
) -> None:
    line = one_error_line(capsys, ["run", str(project(tmp_path, episode))])
    assert line.startswith("loops: error: runtime.factory = 'episode:Game'") and needle in line
    assert "do not fit" not in line


def test_options_that_do_not_fit_the_constructor_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    episode = GAME + "    def __init__(self, size):\n        super().__init__()\n"
    config = project(tmp_path, episode, config=CONFIG + "[runtime.options]\nsise = 3\n")
    line = one_error_line(capsys, ["run", str(config)])
    assert "runtime.options do not fit episode:Game" in line and "sise" in line


def test_tasks_that_raise_are_a_check_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    episode = GAME.replace('return ["t"]', "raise OSError('tasks.jsonl is gone')")
    assert main(["check", str(project(tmp_path, episode))]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "problem: runtime.factory = 'episode:Game' raised OSError: tasks.jsonl is gone" in out.out
    # The template preflight runs before the runtime: SmolLM2's own template keeps every turn, drops tool calls.
    assert (
        "template: chat_template on a sample tool conversation: 2 model calls, 0 sequence break(s)" in out.out
    )
    assert "tool call round trip fails" in out.out


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("group_size = true", "training.group_size: Input should be a valid integer (got True)"),
        ('group_size = "16"', "training.group_size: Input should be a valid integer (got '16')"),
        ("learning_rate = true", "training.learning_rate: Input should be a valid number (got True)"),
        ("max_steps = 5.0", "training.max_steps: Input should be a valid integer (got 5.0)"),
    ],
)
def test_config_types_are_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, needle: str
) -> None:
    path = tmp_path / "train.toml"
    path.write_text(CONFIG + f"[training]\n{setting}\n")
    line = one_error_line(capsys, ["check", str(path)])
    assert needle in line and str(path) in line


def test_an_int_is_still_a_float_and_paths_are_still_strings(tmp_path: Path) -> None:
    config = project(tmp_path, config=CONFIG + "[training]\nlearning_rate = 1\n")
    loaded = load(config).config
    assert loaded.training.learning_rate == 1.0 and loaded.output.output_dir == tmp_path / "runs"


def test_check_warns_about_settings_that_cannot_train(tmp_path: Path) -> None:
    config = load(project(tmp_path), overrides={"training.group_size": 1, "sampling.temperature": 0}).config
    warnings = cannot_train(config)
    assert any(w.startswith("training.group_size = 1: a group of one") for w in warnings)
    assert any(w.startswith("sampling.temperature = 0") for w in warnings)
    assert cannot_train(load(project(tmp_path)).config) == []
    report = RecipeCheckReport(warnings=warnings)
    assert report.ok and "warning: training.group_size = 1" in "\n".join(report.describe())
    assert report.describe()[-1] == "check: ok with 2 warning(s)"


def test_check_names_a_custom_loss_and_refuses_one_that_does_not_import(tmp_path: Path) -> None:
    from loops_nb.rl.custom_loss import kl_to_reference

    config = project(tmp_path)
    report = load(config, overrides={"training.loss": kl_to_reference(0.1)}).check_sync()
    assert (
        "loss: custom loops_nb.rl.custom_loss:kl_to_reference(beta=0.1) through forward_backward_custom "
        "(scores ref_logprobs with the version-0 policy)" in report.lines
    )
    missing = load(config, overrides={"training.loss": "episode:no_such_loss"}).check_sync()
    assert not missing.ok
    assert (
        "training.loss = 'episode:no_such_loss': module 'episode' has no 'no_such_loss'" in missing.problems
    )
