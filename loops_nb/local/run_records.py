"""What a `loops serve` remembers across its own restarts: one small record per run and per sampler, so a
new process on the same state directory answers an earlier run `RunLost` instead of "unknown" and serves
an earlier standalone sampler again (docs/reference/failures.md, "The trainer or sampler process dying and
coming back"). Each checkpoint's `CheckpointRecord` is what `list_checkpoints` answers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from baseten.loops import Checkpoint

from loops_nb.errors import TrainerError
from loops_nb.run_dir import atomic_write_json

RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")
"""The shape `LocalLoopsState.create_run` gives run ids; anything else is never looked up on disk."""
BASE_SAMPLER_ID = re.compile(r"^smp-base-[0-9a-f]{12}$")

RUN_RECORD = "run.json"


class CheckpointRecord(Checkpoint):
    """The SDK's `Checkpoint`, as `list_checkpoints` answers it, plus the bt:// path it was saved under."""

    path: str


class RunLost(TrainerError):
    """A run this server's state directory knows, whose live trainer state died with an earlier process.

    Answered 410 Gone: the SDK retries only 400, 404, 408 and 502 (and 503 on /sample), so a 410
    reaches the caller at once, with this message.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id} is gone: the Loops server restarted after creating it, and the trainer state "
            "the run held there (its weights and optimizer since the last checkpoint) died with the old "
            "process; resume the run from its last checkpoint"
        )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


class RunRecords:
    """Records under `<state_dir>/runs/<run id>/run.json` and `<state_dir>/samplers/<sampler id>.json`."""

    def __init__(self, state_dir: Path, instance: str) -> None:
        self.state_dir = state_dir
        self.instance = instance
        """This server process's id: a record written under another id belongs to an earlier process."""

    def write_run(
        self, run_id: str, base_model: str, lora_rank: int, name: str | None, created_at: str
    ) -> None:
        record = {
            "id": run_id,
            "base_model": base_model,
            "lora_rank": lora_rank,
            "name": name,
            "created_at": created_at,
            "server_instance": self.instance,
        }
        atomic_write_json(self.state_dir / "runs" / run_id / RUN_RECORD, record)

    def earlier_run(self, run_id: str) -> dict[str, Any] | None:
        """The record of a run an earlier process of this server created, or None if there is none."""
        if not RUN_ID.match(run_id):
            return None
        record = _read(self.state_dir / "runs" / run_id / RUN_RECORD)
        if record is None or record.get("server_instance") == self.instance:
            return None
        return record

    def write_base_sampler(self, sampler_id: str, base_model: str) -> None:
        path = self.state_dir / "samplers" / f"{sampler_id}.json"
        if _read(path) is None:
            atomic_write_json(path, {"id": sampler_id, "base_model": base_model})

    def base_sampler(self, sampler_id: str) -> str | None:
        """The base model of a standalone sampler created by any process of this server, or None."""
        if not BASE_SAMPLER_ID.match(sampler_id):
            return None
        record = _read(self.state_dir / "samplers" / f"{sampler_id}.json")
        model = record.get("base_model") if record else None
        return model if isinstance(model, str) and model else None
