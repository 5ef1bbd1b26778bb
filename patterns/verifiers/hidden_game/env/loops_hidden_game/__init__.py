"""The loops_nb quickstart as a verifiers 0.4 environment (taskset id `loops-hidden-game`).

    uv pip install patterns/verifiers/hidden_game/env      # into the verifiers venv
    python episode_driver.py list --env loops-hidden-game --env-args '{}'

verifiers 0.4 finds an environment by importing the module named by its id (`-` -> `_`) and taking
the `Taskset` subclass (and, optionally, the `Harness` subclass) it exports through `__all__`.
"""

from loops_hidden_game.harness import ChatHarness, ChatHarnessConfig
from loops_hidden_game.taskset import HiddenGameConfig, HiddenGameData, HiddenGameTask, HiddenGameTaskset

__all__ = [
    "ChatHarness",
    "ChatHarnessConfig",
    "HiddenGameConfig",
    "HiddenGameData",
    "HiddenGameTask",
    "HiddenGameTaskset",
]
