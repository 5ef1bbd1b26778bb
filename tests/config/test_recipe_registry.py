"""A recipe from outside the package: its config model and its `check` / `train` come from the registry, so
`project.check()` runs the registered recipe, not a `loops_nb.<name>` module that does not exist."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loops_nb import load
from loops_nb.config import RECIPES, register_recipe

CONFIG_MODULE = '''
from pydantic import BaseModel

from loops_nb.config.sections import RecipeConfig


class Training(BaseModel):
    beta: float = 0.1
    """The preference strength."""


class DPOConfig(RecipeConfig):
    training: Training = Training()
    """The preference training."""
'''

RECIPE_MODULE = """
class Report:
    def __init__(self, lines):
        self.lines = lines

    def describe(self):
        return self.lines


async def check(project, **_):
    return Report([f"dpo check: beta {project.config.training.beta}"])
"""


@pytest.fixture
def outside_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "my_pkg" / "dpo"
    package.mkdir(parents=True)
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(CONFIG_MODULE)
    (package / "checks.py").write_text(RECIPE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("my_pkg")]:
        del sys.modules[name]


def test_a_registered_recipe_module_runs_the_check(
    outside_recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RECIPES, "_paths", dict(RECIPES._paths))
    monkeypatch.setattr(RECIPES, "_recipe_modules", dict(RECIPES._recipe_modules))
    monkeypatch.setattr(RECIPES, "_models", dict(RECIPES._models))
    register_recipe("dpo", "my_pkg.dpo.config:DPOConfig", recipe_module="my_pkg.dpo.checks")
    config = outside_recipe / "dpo.toml"
    config.write_text('recipe = "dpo"\n[training]\nbeta = 0.5\n')
    assert load(config).check_sync().describe() == ["dpo check: beta 0.5"]


def test_the_recipe_module_defaults_to_recipe_beside_the_config_model() -> None:
    assert RECIPES.recipe_module("rl") == "loops_nb.rl.recipe"
    assert RECIPES.recipe_module("sft") == "loops_nb.sft.recipe"
