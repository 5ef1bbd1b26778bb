"""A finished (or stopped) run read back to use what it trained: its model and compute settings, its checkpoints,
and the Loops it trained on. Used by `loops export` (`export.py`) and by the policy sampler (`policy_sampler.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from loops_nb.config.sections import ComputeConfig, ModelConfig
from loops_nb.errors import UserError
from loops_nb.run_checkpoints import RunCheckpoint, find_checkpoint
from loops_nb.run_dir import RunDirectory, RunJson
from loops_nb.validation_message import validation_message

if TYPE_CHECKING:
    from loops_nb.compute import LoopsConnection


@dataclass
class SavedRun:
    """A run directory with its saved config's model and compute sections."""

    run_dir: RunDirectory
    run_json: RunJson
    model: ModelConfig
    compute: ComputeConfig

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> SavedRun:
        run_dir = RunDirectory.existing(path)
        run_json = run_dir.read_run_json()
        if run_json is None:
            raise UserError(
                f"{run_dir.root}: no run.json, so not a run directory (or the run never reached Loops)"
            )
        config = run_json.get("config")
        if not isinstance(config, dict) or "model" not in config:
            raise UserError(f"{run_dir.run_json}: holds no saved config (written by an older loops_nb?)")
        try:
            model = ModelConfig.model_validate(config["model"])
            compute = ComputeConfig.model_validate(config.get("compute") or {})
        except ValidationError as exc:
            raise UserError(
                f"{run_dir.run_json}: its saved config does not validate: {validation_message(exc, top='config')}"
            ) from None
        return cls(run_dir, run_json, model, compute)

    @property
    def root(self) -> Path:
        return self.run_dir.root

    def checkpoint(self, spec: str | int = "latest") -> RunCheckpoint:
        """The saved checkpoint ``spec`` names (see `find_checkpoint`); ``base`` names none, so it is refused."""
        found = find_checkpoint(self.run_dir, spec)
        if found is None:
            raise UserError(
                f"{self.root}: base is the untrained model, not a checkpoint; give latest or a step"
            )
        return found

    async def connect(self) -> LoopsConnection:
        """The Loops the run trained on: on the local scope an embedded Loops on the run's own state directory
        (where its checkpoints are), elsewhere Baseten with BASETEN_API_KEY."""
        from loops_nb.compute import LoopsConnection

        return await LoopsConnection.open(self.compute, state_dir=self.run_dir.state / "local_loops")
