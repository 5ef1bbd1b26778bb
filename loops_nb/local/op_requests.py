"""The bodies the SDK posts to create a trainer and to submit its ops, as pydantic models over the SDK's types.

The SDK builds these bodies as dicts around its own models (`Datum`, `AdamParams`; bl/training_client.py
`_op_body`), so they are declared here from the SDK's classes. Validating at submit answers a malformed
request 422 at once. Keys the server does not read are ignored (the SDK adds `seq_id` and `run_id`).
"""

from __future__ import annotations

import math
from typing import Annotated

from baseten.loops import AdamParams, Datum
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_LORA_RANK = 1024
LoraRank = Annotated[int, Field(strict=True, ge=1, le=MAX_LORA_RANK)]
"""The one check of a LoRA rank, at trainer creation and at every `init_trainer_server`."""
MAX_TOP_K_LOGPROBS = 20
"""The SDK documents `top_k_logprobs` as 0 through 20 (bl/training_client.py:834-836)."""
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


class CreateTrainer(BaseModel):
    """`POST /v1/loops/trainers` (the control plane, `ServiceClient.create_lora_training_client`)."""

    base_model: NonEmpty
    lora_rank: LoraRank = 32
    base_checkpoint: str | None = None
    """Not supported by the embedded Loops; the route refuses it by name."""
    max_seq_len: Annotated[int, Field(strict=True, ge=1)] | None = None
    seed: int | None = None
    name: str | None = None


class OpRequest(BaseModel):
    """What every trainer op body carries: the base model the client was created for."""

    model_config = ConfigDict(frozen=True)

    model: str | None = None
    base_model: str | None = None


class InitTrainerServer(OpRequest):
    lora_rank: LoraRank


class Forward(OpRequest):
    """`/forward` and `/forward_backward`. `loss_fn` and its config are checked by `datum_wire`."""

    data: list[Datum] = Field(min_length=1)
    loss_fn: Annotated[str, Field(strict=True)] = "cross_entropy"
    loss_fn_config: dict[str, float | bool] | None = None
    top_k_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_TOP_K_LOGPROBS)] | None = None


class OptimStep(OpRequest):
    """The SDK's `AdamParams` (its defaults are Loops'; `grad_clip_norm` 0 disables clipping), checked here
    so that no step changes anything with a value that is not a finite non-negative number."""

    adam_params: AdamParams

    @field_validator("adam_params")
    @classmethod
    def _finite_non_negative(cls, adam: AdamParams) -> AdamParams:
        for key, value in adam.model_dump().items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key} must be a finite non-negative number, got {value!r}")
        return adam


class SaveWeights(OpRequest):
    """`/save_state` and `/save_weights_for_sampler` (which alone sends `bump_version`)."""

    name: str = ""
    bump_version: bool = False


class LoadWeights(OpRequest):
    """`/load_state` and `/load_state_with_optimizer`: `path` is what `save_state` returned."""

    path: NonEmpty


OP_REQUESTS: dict[str, type[OpRequest]] = {
    "init_trainer_server": InitTrainerServer,
    "forward": Forward,
    "forward_backward": Forward,
    "optim_step": OptimStep,
    "save_state": SaveWeights,
    "load_state": LoadWeights,
    "load_state_with_optimizer": LoadWeights,
    "save_weights_for_sampler": SaveWeights,
}
"""Each trainer op the embedded Loops serves, and its body."""
