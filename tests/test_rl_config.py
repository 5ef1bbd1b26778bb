"""tests/rl_config.py writes the TOML it is given: the tests that build their configs with it rely on that."""

from __future__ import annotations

import tomllib
from pathlib import Path

from rl_config import TINY_RUN, rl_config_toml, tiny_run_toml

from loops_nb import load


def test_the_least_config_is_the_recipe_and_the_runtime() -> None:
    assert rl_config_toml("episode:Game") == 'recipe = "rl"\n[runtime]\nfactory = "episode:Game"\n'


def test_values_and_nested_tables_parse_back_as_given() -> None:
    odd = 'a "quoted" \\ path\twith\x7f and é'
    text = rl_config_toml(
        "loops_nb.harbor:create_runtime",
        options={"tasks": odd, "agent_kwargs": {"command": ["python", "p.py"], "careless": False}},
        providers={"sandbox": {"type": "local", "scratch_dir": Path("/tmp/x")}},
        training={"learning_rate": 1e-3, "max_steps": 2, "loss_config": {"clip.low": 0.2}},
    )
    assert tomllib.loads(text) == {
        "recipe": "rl",
        "runtime": {
            "factory": "loops_nb.harbor:create_runtime",
            "options": {"tasks": odd, "agent_kwargs": {"command": ["python", "p.py"], "careless": False}},
        },
        "providers": {"sandbox": {"type": "local", "scratch_dir": "/tmp/x"}},
        "training": {"learning_rate": 1e-3, "max_steps": 2, "loss_config": {"clip.low": 0.2}},
    }


def test_a_tiny_run_merges_over_its_defaults_and_none_removes_one(tmp_path: Path) -> None:
    text = tiny_run_toml(
        "episode:Game",
        tmp_path / "model",
        tmp_path / "runs",
        compute={"base_url": "http://127.0.0.1:1", "local": None},
        training={"group_size": 2},
    )
    parsed = tomllib.loads(text)
    assert parsed["model"] == {"base_model": str(tmp_path / "model"), **TINY_RUN["model"]}
    assert parsed["compute"] == {"base_url": "http://127.0.0.1:1"}
    assert parsed["training"] == {**TINY_RUN["training"], "group_size": 2}
    (tmp_path / "train.toml").write_text(text)
    config = load(tmp_path / "train.toml").config
    assert config.output.output_dir == tmp_path / "runs" and config.training.group_size == 2
