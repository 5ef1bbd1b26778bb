"""The public harbor-cookbook recipes on the local sandbox: each is refused by `check`, or its reference solution
scores 1.0 (no task passes `check` and then grades a correct solution below 1.0).

Opt-in: the recipes are not vendored here. Point `HARBOR_COOKBOOK_DIR` at a checkout's
`harbor_cookbook/recipes` folder (https://github.com/harbor-framework/harbor-cookbook):

    HARBOR_COOKBOOK_DIR=~/harbor-cookbook/harbor_cookbook/recipes uv run --all-extras pytest tests/harbor/test_harbor_cookbook.py

Every recipe is checked with `ignore_dockerfile = true` (the host stands in for the image its RUN lines
build), the setting under which multi-container, mcp-tools, simulated-user and both computer-use recipes
used to pass `check`; their helper services then never existed and the right answer scored 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harbor.models.task.task import Task as HarborTask
from oracle_trials import run_oracle

from loops_nb.providers.local_task_fit import static_problems

COOKBOOK = os.environ.get("HARBOR_COOKBOOK_DIR")
RECIPES = (
    sorted(p for p in Path(COOKBOOK).expanduser().iterdir() if (p / "task.toml").is_file())
    if COOKBOOK
    else []
)

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(not COOKBOOK, reason="set HARBOR_COOKBOOK_DIR to a harbor-cookbook recipes folder"),
]


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
async def test_a_recipe_is_refused_or_its_solution_scores_1(recipe: Path, tmp_path: Path) -> None:
    env = HarborTask(recipe).config.environment
    refused = static_problems(recipe.name, recipe / "environment", env, ignore_dockerfile=True)
    if refused:
        assert all(line.startswith(f"task {recipe.name}: ") for line in refused)
        pytest.skip("refused by check: " + " | ".join(refused))
    result = await run_oracle(recipe, tmp_path)
    assert result.exception_info is None, result.exception_info
    rewards = (result.verifier_result and result.verifier_result.rewards) or {}
    assert rewards, "the verifier wrote no reward"
    assert rewards.get("reward", min(rewards.values())) == 1.0, rewards
