"""The config loader: path rules, .env rules, overrides and one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rl_config import rl_config_toml

from loops_nb import load
from loops_nb.config.loader import SHIPPED_NOTE, apply_overrides, parse_override_value
from loops_nb.errors import ConfigError

SFT = """
recipe = "sft"
[data]
train = "data/train.jsonl"
[model]
chat_template_file = "templates/t.jinja"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_paths_are_relative_to_the_config_and_output_dir_to_the_cwd(tmp_path, monkeypatch):
    cfg = write(tmp_path / "proj" / "sft.toml", SFT)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    project = load(cfg)
    assert project.config.data.train == tmp_path / "proj" / "data" / "train.jsonl"
    assert project.config.model.chat_template_file == tmp_path / "proj" / "templates" / "t.jinja"
    assert project.config.output.output_dir == work / "runs"
    assert project.path == cfg


def test_a_symlinked_config_means_its_targets_directory(tmp_path, monkeypatch):
    real = write(tmp_path / "shared" / "sft.toml", SFT)
    link = tmp_path / "project" / "sft.toml"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.chdir(tmp_path / "project")
    project = load("sft.toml")
    assert project.config.data.train == tmp_path / "shared" / "data" / "train.jsonl"
    lines = project.describe()
    assert lines[0] == f"Config: {link} -> {real}"
    assert lines[1] == f"  paths, modules: beside {tmp_path / 'shared'}"
    assert lines[3] == f"  runs: {tmp_path / 'project' / 'runs'}"


def test_override_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    cfg = write(tmp_path / "proj" / "sft.toml", SFT)
    monkeypatch.chdir(tmp_path)
    project = load(cfg, overrides={"data.train": "other.jsonl", "training.max_steps": 5})
    assert project.config.data.train == tmp_path / "other.jsonl"
    assert project.config.training.max_steps == 5


def test_the_config_directory_is_importable(tmp_path, monkeypatch):
    cfg = write(tmp_path / "p" / "sft.toml", SFT)
    write(tmp_path / "p" / "beside_module_xyz.py", "VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    load(cfg)
    import beside_module_xyz  # type: ignore[import-not-found]

    assert beside_module_xyz.VALUE == 7


def test_env_file_only_when_passed_and_never_overrides(tmp_path, monkeypatch):
    cfg = write(tmp_path / "p" / "sft.toml", SFT)
    write(tmp_path / "p" / ".env", "LOOPS_NB_T1=from-file\nLOOPS_NB_T2=from-file\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPS_NB_T1", raising=False)
    monkeypatch.setenv("LOOPS_NB_T2", "already-set")
    project = load(cfg)
    assert "LOOPS_NB_T1" not in os.environ
    assert project.source.env_files == ()
    project = load(cfg, env_file=".env")
    assert os.environ["LOOPS_NB_T1"] == "from-file"
    assert os.environ["LOOPS_NB_T2"] == "already-set"
    monkeypatch.delenv("LOOPS_NB_T1")
    with pytest.raises(ConfigError, match="missing.env: env_file not found"):
        load(cfg, env_file="missing.env")


def test_cli_reads_env_beside_config_and_in_cwd(tmp_path, monkeypatch):
    from loops_nb.config import load_config

    cfg = write(tmp_path / "p" / "sft.toml", SFT)
    write(tmp_path / "p" / ".env", "LOOPS_NB_A=beside\n")
    write(tmp_path / "w" / ".env", "LOOPS_NB_A=cwd\nLOOPS_NB_B=cwd\n")
    monkeypatch.chdir(tmp_path / "w")
    monkeypatch.delenv("LOOPS_NB_A", raising=False)
    monkeypatch.delenv("LOOPS_NB_B", raising=False)
    loaded = load_config(cfg, cli_env=True)
    assert os.environ["LOOPS_NB_A"] == "beside"  # the config's .env first; later files never override
    assert os.environ["LOOPS_NB_B"] == "cwd"
    assert loaded.source.env_files == (tmp_path / "p" / ".env", tmp_path / "w" / ".env")
    monkeypatch.delenv("LOOPS_NB_A")
    monkeypatch.delenv("LOOPS_NB_B")


def test_a_missing_config_falls_back_to_the_shipped_copy(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    write(shipped / "examples" / "x" / "sft.toml", SFT)
    monkeypatch.setattr(
        "loops_nb.config.loader.find_shipped", lambda rel: shipped / rel if (shipped / rel).exists() else None
    )
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    project = load("examples/x/sft.toml")
    assert project.path == shipped / "examples" / "x" / "sft.toml"
    assert (
        project.describe()[0] == f"Config: {work / 'examples/x/sft.toml'} -> {project.path} ({SHIPPED_NOTE})"
    )
    # A file at that path in the working directory wins over the shipped one, and says where it is.
    local = write(work / "examples" / "x" / "sft.toml", SFT)
    assert load("examples/x/sft.toml").path == local
    assert load("examples/x/sft.toml").describe()[0] == f"Config: {local}"


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        (
            SFT + "\n[training]\nmax_stepz = 3\n",
            {},
            "unknown key training.max_stepz; did you mean 'max_steps'?",
        ),
        (
            SFT + '\n[training]\nmax_steps = "many"\n',
            {},
            "training.max_steps: Input should be a valid integer",
        ),
        (SFT, {"training.learning_rate": -1}, "override --training.learning_rate: training.learning_rate"),
        (
            SFT + '\n[compute]\nscope = "serverless"\nreplicas = 2\n',
            {},
            "compute.replicas: sizes a deployment",
        ),
        (SFT + '\n[compute]\nscope = "local"\nspot = true\n', {}, "compute.spot"),
        ('recipe = "sft"\n', {}, "data is required"),
        ("[model]\nlora_rank = 8\n", {}, 'recipe is missing; set recipe = "rl" or "sft"'),
        ('recipe = "dpo"\n', {}, "recipe is 'dpo'"),
        ("recipe = \n", {}, "invalid TOML"),
        (
            SFT + '\n[compute]\nscope = "cloud"\n',
            {},
            "compute.scope: Input should be 'serverless', 'dedicated' or 'local'",
        ),
    ],
)
def test_bad_configs_fail_with_one_clear_line_naming_the_file_and_key(tmp_path, text, overrides, expected):
    cfg = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        load(cfg, overrides=overrides)
    message = str(info.value)
    assert expected in message
    assert len(message.splitlines()) == 1
    if "override" not in expected:
        assert str(cfg) in message


def test_missing_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        load("nope.toml")


def test_json_configs_work_and_report_their_position(tmp_path):
    good = write(tmp_path / "c.json", '{"recipe": "sft", "data": {"train": "t.jsonl"}}')
    assert load(good).config.data.train == tmp_path / "t.jsonl"
    bad = write(tmp_path / "b.json", '{"recipe": "sft",')
    with pytest.raises(ConfigError, match=r"b.json:1:\d+: invalid JSON"):
        load(bad)


def test_override_values_parse_as_toml_literals():
    assert parse_override_value("5") == 5
    assert parse_override_value("true") is True
    assert parse_override_value("[1, 2]") == [1, 2]
    assert parse_override_value("serverless") == "serverless"
    assert parse_override_value('"5"') == "5"
    with pytest.raises(ConfigError, match="training.max_steps is a value, not a table"):
        apply_overrides({"training": {"max_steps": 1}}, {"training.max_steps.x": 1})


def test_two_configs_with_same_named_modules_each_get_their_own(tmp_path, monkeypatch):
    from loops_nb.episodes import load_runtime

    monkeypatch.chdir(tmp_path)
    for name, answer in (("first", 1.0), ("second", 2.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "episode.py").write_text(
            "from loops_nb.episodes import Episode\n"
            f"class Game(Episode):\n    ANSWER = {answer}\n    def tasks(self):\n        return ['t']\n"
        )
        (d / "train.toml").write_text(rl_config_toml("episode:Game"))
    first = load(tmp_path / "first" / "train.toml")
    assert load_runtime(first.config.runtime.factory, {}).episode.ANSWER == 1.0
    second = load(tmp_path / "second" / "train.toml")
    assert load_runtime(second.config.runtime.factory, {}).episode.ANSWER == 2.0, (
        "not the cached first episode.py"
    )
    load(tmp_path / "first" / "train.toml")
    assert load_runtime(first.config.runtime.factory, {}).episode.ANSWER == 1.0
