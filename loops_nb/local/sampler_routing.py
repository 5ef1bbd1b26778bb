"""Which sampler a `/samplers/{sampler_id}/...` call names, and which adapter serves its `/sample`.

Sampler ids: `smp-<run id>` is a run's paired sampler, which serves the run's published policy;
`smp-base-<hash>` is a standalone sampler on a base model, also the one created on saved sampler weights
(the SDK names those weights on every `/sample`, in `X-Checkpoint-Path`). A base-model sampler holds no
state, so one that an earlier process on the same state directory created is served as before
(`run_records`); the paired sampler of a run lost with that process is answered 410 (`RunLost`).

A `/sample` runs on the base model unless its headers say otherwise: `X-Min-Policy-Version` (with
`X-Run-Id` or a paired sampler) samples the run's live adapter once the run has published that version,
waiting up to `PUBLISH_WAIT_SECONDS` for it; `X-Checkpoint-Path` samples saved sampler weights, loaded
into the model's shared sampler on first use.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING

from loops_nb.errors import TrainerError
from loops_nb.local.bad_request import BadRequest
from loops_nb.local.run_records import RunLost

if TYPE_CHECKING:
    from loops_nb.local.local_run import LocalRun
    from loops_nb.local.sampler import SamplerEngine
    from loops_nb.local.state import LocalLoopsState

PUBLISH_WAIT_SECONDS = 20.0
"""How long `/sample` waits for a policy version it was asked for before answering 408."""


class PolicyNotPublished(TrainerError):
    """The run has not published the policy version a `/sample` asked for within the wait (a 408)."""


class SamplerRouting:
    """The samplers of one server by id, and the adapter each `/sample` is served with."""

    def __init__(self, state: LocalLoopsState) -> None:
        self.state = state
        self.samplers: dict[str, tuple[str, str | None]] = {}
        """sampler id -> (base model, run id of a paired sampler or None)."""

    def pair(self, run: LocalRun) -> str:
        """The id of `run`'s paired sampler."""
        sampler_id = f"smp-{run.id}"
        self.samplers[sampler_id] = (run.base_model, run.id)
        return sampler_id

    def standalone(self, base_model: str) -> str:
        """The id of the standalone sampler on `base_model`, recorded for later server processes too."""
        sampler_id = "smp-base-" + hashlib.sha256(base_model.encode()).hexdigest()[:12]
        self.samplers[sampler_id] = (base_model, None)
        self.state.records.write_base_sampler(sampler_id, base_model)
        return sampler_id

    def on_checkpoint(self, model_path: str) -> tuple[str, str]:
        """(sampler id, base model) of a standalone sampler on saved sampler weights: the base model's, as
        on a restarted server, since every `/sample` names the weights again."""
        self.state.resolve_checkpoint(model_path)  # refuses paths outside the state directory
        found = self.state.checkpoints(checkpoint_path=model_path)
        if not found or found[0].target != "sampler":
            raise BadRequest(
                f"model_path {model_path!r}: not sampler weights this server saved; give the path "
                "save_weights_for_sampler returned (bt://loops:<run>/sampler_weights/<name>)"
            )
        base_model = found[0].base_model
        return self.standalone(base_model), base_model

    def lookup(self, sampler_id: str) -> tuple[str, str | None]:
        """(base model, paired run id or None) of a sampler this server or an earlier one created."""
        if sampler_id in self.samplers:
            return self.samplers[sampler_id]
        base_model = self.state.records.base_sampler(sampler_id)
        if base_model is not None:
            self.samplers[sampler_id] = (base_model, None)
            return self.samplers[sampler_id]
        paired_run = sampler_id.removeprefix("smp-")
        if self.state.records.earlier_run(paired_run) is not None:
            raise RunLost(paired_run)
        raise BadRequest(f"unknown sampler {sampler_id!r}")

    async def serving_adapter(
        self, engine: SamplerEngine, run_id: str | None, min_version: str | None, checkpoint: str | None
    ) -> tuple[str | None, int]:
        """(adapter to sample, None for the base model; the policy version to report) for a `/sample` with
        these routing headers. Raises `PolicyNotPublished` when the version asked for did not come."""
        adapter, served = None, 0
        # A deactivated run's clients are refused, whatever policy version they pin: a version-0 client
        # (no floor header) would otherwise quietly get the base model.
        run = self.state.run(run_id) if run_id else None
        if min_version is not None:
            if run is None:
                raise BadRequest("X-Min-Policy-Version needs a run (X-Run-Id or a paired sampler)")
            if not min_version.strip().isdigit():
                raise BadRequest(f"X-Min-Policy-Version must be a whole number, got {min_version[:40]!r}")
            wanted = int(min_version)
            if run.published_version >= wanted:
                adapter, served = run.id, run.published_version
            elif checkpoint is None:
                caught_up = await asyncio.to_thread(
                    self.state.wait_published, run, wanted, PUBLISH_WAIT_SECONDS
                )
                if not caught_up:
                    raise PolicyNotPublished(
                        f"sampler serves policy version {run.published_version} < {wanted}"
                    )
                adapter, served = run.id, run.published_version
        if adapter is None and checkpoint is not None:
            adapter = checkpoint
            if engine.adapter_version(checkpoint) is None:
                directory = self.state.resolve_checkpoint(checkpoint)
                await asyncio.to_thread(engine.load_adapter_dir, checkpoint, directory)
        return adapter, served
