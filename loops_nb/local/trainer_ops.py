"""The trainer's operations: what each `POST /<op>` body does to a run's LoRA trainer.

`prepare` validates a submit's body into its `op_requests` model (a bad one is answered 422 at once) and
returns the work, which runs on the run's op-queue worker (FIFO, one at a time) and answers the SDK's own
response model (`InitTrainerServerResponse`, `ForwardBackwardOutput`, ...). Raising there turns into a
`{"status": "error"}` poll body, which the SDK raises as `RemoteOpError` with the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from baseten.loops import (
    ForwardBackwardOutput,
    InitTrainerServerResponse,
    LoadWeightsResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)
from pydantic import BaseModel

from loops_nb.local.bad_request import BadRequest
from loops_nb.local.datum_wire import parse_datums, resolve_loss_config
from loops_nb.local.idle_runs import unpark
from loops_nb.local.local_run import LocalRun
from loops_nb.local.op_requests import (
    OP_REQUESTS,
    Forward,
    InitTrainerServer,
    LoadWeights,
    OptimStep,
    SaveWeights,
)
from loops_nb.local.state import LocalLoopsState, checkpoint_name

if TYPE_CHECKING:
    from loops_nb.local.trainer import LoraTrainer


def _trainer(state: LocalLoopsState, run: LocalRun) -> LoraTrainer:
    if run.trainer is None and run.parked_step is not None:
        return unpark(run, state.new_trainer)
    if run.trainer is None:
        raise BadRequest(f"run {run.id}: the trainer is not initialised (init_trainer_server first)")
    return run.trainer


def prepare(state: LocalLoopsState, run: LocalRun, op: str, body: object) -> Callable[[], BaseModel]:
    """Validate a submit of `op` (one of `OP_REQUESTS`, which the app checked) cheaply and return its work.

    A bad body raises `ValidationError` or `BadRequest`, which the app answers 422 at once."""
    request = OP_REQUESTS[op].model_validate(body)
    model = request.model or request.base_model
    if model is not None and model != run.base_model:
        raise BadRequest(f"run {run.id} trains {run.base_model!r}, not {model!r}")
    if isinstance(request, InitTrainerServer):
        rank = request.lora_rank
        return lambda: _init(state, run, rank)
    if isinstance(request, Forward):
        loss_fn, config, top_k = request.loss_fn, request.loss_fn_config, request.top_k_logprobs or 0
        resolve_loss_config(loss_fn, config)
        # Parsed once here so a bad datum is answered 422 at submit; the worker reuses the parse.
        data = parse_datums(
            request.data,
            loss_fn,
            vocab_size=state.vocab_size(run.base_model),
            max_length=state.max_datum_length(run),
            allow_images=state.is_vision(run.base_model),
        )
        backward = op == "forward_backward"

        def forward() -> ForwardBackwardOutput:
            return _trainer(state, run).forward(data, loss_fn, config, top_k, backward=backward)

        return forward
    if isinstance(request, OptimStep):
        adam = request.adam_params
        return lambda: _trainer(state, run).optim_step(adam)
    if isinstance(request, LoadWeights):
        path, with_optimizer = request.path, op == "load_state_with_optimizer"
        return lambda: LoadWeightsResponse(
            step=_trainer(state, run).load_state(
                state.resolve_checkpoint(path), with_optimizer=with_optimizer
            )
        )
    assert isinstance(request, SaveWeights)
    name, bump = checkpoint_name(request.name), request.bump_version
    if op == "save_state":
        return lambda: _save_state(state, run, name)
    return lambda: _save_for_sampler(state, run, name, bump)


def _init(state: LocalLoopsState, run: LocalRun, rank: int) -> InitTrainerServerResponse:
    run.parked_step = None  # a fresh adapter replaces whatever was parked
    if run.trainer is None:
        run.trainer = state.new_trainer(run)
    run.lora_rank = rank
    return run.trainer.init(rank, seed=run.seed)


def _save_state(state: LocalLoopsState, run: LocalRun, name: str) -> SaveWeightsResponse:
    _trainer(state, run).save_state(state.checkpoint_dir(run.id, "weights", name))
    return SaveWeightsResponse(mode="local", path=state.record_checkpoint(run, "weights", name))


def _save_for_sampler(
    state: LocalLoopsState, run: LocalRun, name: str, bump: bool
) -> SaveWeightsForSamplerResponse:
    trainer = _trainer(state, run)
    trainer.save_adapter(state.checkpoint_dir(run.id, "sampler_weights", name))
    path = state.record_checkpoint(run, "sampler_weights", name)
    version = trainer.step
    if bump:
        # Finish the op only once the sampler serves the new weights, so the SDK's first
        # /sample after publishing is not bounced with 408s.
        engine = state.sampler(run.base_model)
        engine.set_adapter(run.id, trainer.lora_config_dict(), trainer.adapter_state_dict(), version)
        state.publish(run, version)
        state.prune_published(run, keep=name)
    return SaveWeightsForSamplerResponse(version=version, path=path)
