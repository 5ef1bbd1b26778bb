"""A run's checkpoints, found by name or step, and any of them as a sampling client: the one path from a
checkpoint to a sampler, which `loops eval`, `project.sampler()` and SFT's `compare` all take. Why trainer
state is loaded *with its optimizer*: docs/reference/after_training.md#try-the-policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from loops_nb.errors import UserError
from loops_nb.run_dir import RunDirectory

if TYPE_CHECKING:
    from baseten.loops import SamplingClient

    from loops_nb.compute import LoopsConnection
    from loops_nb.config.sections import ModelConfig

BASE = "base"
"""The checkpoint name of the untrained base model."""

_BT = re.compile(r"^bt://loops:(?P<run>[^/]+)/(?P<kind>weights|sampler_weights)/(?P<name>[^/]+)/?$")


@dataclass(frozen=True)
class RunCheckpoint:
    """One saved checkpoint of a run."""

    step: int
    path: str
    """Its bt:// path, as the SDK returned it."""
    kind: Literal["sampler", "trainer"]

    @property
    def name(self) -> str:
        return self._parts()["name"]

    @property
    def loops_run_id(self) -> str:
        return self._parts()["run"]

    def _parts(self) -> dict[str, str]:
        match = _BT.match(self.path)
        if match is None:
            raise UserError(f"checkpoint path {self.path!r} is not a bt://loops:<run>/<kind>/<name> path")
        return match.groupdict()

    def describe(self) -> str:
        what = "sampler weights" if self.kind == "sampler" else "trainer state"
        return f"{what} after step {self.step} ({self.path})"


def run_checkpoints(run_dir: RunDirectory) -> list[RunCheckpoint]:
    """Every checkpoint checkpoints.jsonl records, oldest first (sampler weights after the trainer state of the
    same step)."""
    out = []
    for saved in run_dir.checkpoints():
        out.append(RunCheckpoint(saved.step, saved.path, "trainer"))
        if saved.sampler_path:
            out.append(RunCheckpoint(saved.step, str(saved.sampler_path), "sampler"))
    return out


def find_checkpoint(run_dir: RunDirectory, spec: str | int = "latest") -> RunCheckpoint | None:
    """The checkpoint ``spec`` names, None for ``base``: ``latest`` (the last step's, its sampler weights when
    saved), a step (its sampler weights over its trainer state), a name (``final-000012``, ``state-000010``)
    or a bt:// path."""
    text = str(spec).strip()
    if text == BASE:
        return None
    found = run_checkpoints(run_dir)
    if not found:
        raise UserError(
            f"{run_dir.root}: no checkpoint yet (checkpoints.jsonl is empty); train first, or use base"
        )
    if text in ("latest", "last", "final"):
        return found[-1]
    if text.isdigit():
        at = [c for c in found if c.step == int(text)]
        if at:
            return at[-1]
    for c in found:
        if text in (c.path, c.path.rstrip("/"), c.name):
            return c
    names = ", ".join(f"{c.name} (step {c.step})" for c in found)
    raise UserError(f"{run_dir.root}: no checkpoint {text!r}; give base, latest, a step or a name: {names}")


async def checkpoint_sampling_client(
    connection: LoopsConnection,
    model: ModelConfig,
    checkpoint: RunCheckpoint | None,
    *,
    seed: int | None = None,
) -> SamplingClient:
    """A sampling client that samples ``checkpoint``'s weights (the base model's for None)."""
    kwargs: dict[str, Any] = {}
    if connection.ready_timeout is not None:
        kwargs["ready_timeout"] = connection.ready_timeout
    service = connection.service
    if checkpoint is None:
        return await service.create_sampling_client_async(base_model=model.base_model, **kwargs)
    if checkpoint.kind == "sampler":
        return await service.create_sampling_client_async(model_path=checkpoint.path, **kwargs)
    trainer = await connection.training_client(
        model.base_model, rank=model.lora_rank, seed=seed, max_seq_len=model.max_seq_len
    )
    await (await trainer.load_state_with_optimizer_async(checkpoint.path)).result_async()
    return await trainer.save_weights_and_get_sampling_client_async(f"sample-{checkpoint.name}")
