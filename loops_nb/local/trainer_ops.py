"""The trainer's operations: what each `POST /<op>` body does to a run's LoRA trainer.

Each function runs on the run's op-queue worker (FIFO, one at a time) and returns the result JSON
the SDK validates (`InitTrainerServerResponse`, `ForwardBackwardOutput`, ...). Raising turns into a
`{"status": "error"}` poll body, which the SDK raises as `RemoteOpError` with the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loops_nb.local.bad_request import BadRequest
from loops_nb.local.datum_wire import parse_datums, resolve_loss_config
from loops_nb.local.idle_runs import unpark
from loops_nb.local.local_run import LocalRun
from loops_nb.local.state import LocalLoopsState, checkpoint_name

if TYPE_CHECKING:
    from loops_nb.local.trainer import LoraTrainer

OpFn = Callable[[], dict[str, Any]]


def _trainer(state: LocalLoopsState, run: LocalRun) -> LoraTrainer:
    if run.trainer is None and run.parked_step is not None:
        return unpark(run, state.new_trainer)
    if run.trainer is None:
        raise BadRequest(f"run {run.id}: the trainer is not initialised (init_trainer_server first)")
    return run.trainer


def _check_model(run: LocalRun, body: dict[str, Any]) -> None:
    model = body.get("model") or body.get("base_model")
    if model is not None and model != run.base_model:
        raise BadRequest(f"run {run.id} trains {run.base_model!r}, not {model!r}")


def prepare(state: LocalLoopsState, run: LocalRun, op: str, body: dict[str, Any]) -> OpFn:
    """Validate a submit cheaply (so a bad request is answered 422 at once) and return its work."""
    _check_model(run, body)
    if op == "init_trainer_server":
        rank = body.get("lora_rank")
        if not isinstance(rank, int) or not 1 <= rank <= 1024:
            raise BadRequest(f"lora_rank must be an integer in 1..1024, got {rank!r}")
        return lambda: _init(state, run, rank)
    if op in ("forward", "forward_backward"):
        data = body.get("data")
        loss_fn = body.get("loss_fn", "cross_entropy")
        if not isinstance(data, list) or not data:
            raise BadRequest("data must be a non-empty list of Datum objects")
        config = body.get("loss_fn_config")
        resolve_loss_config(loss_fn, config)
        # Parsed once here so a bad datum is answered 422 at submit; the worker reuses the parse.
        data = parse_datums(
            data,
            loss_fn,
            vocab_size=state.vocab_size(run.base_model),
            max_length=state.max_datum_length(run),
            allow_images=state.is_vision(run.base_model),
        )
        top_k = body.get("top_k_logprobs") or 0
        if not isinstance(top_k, int) or not 0 <= top_k <= 20:
            raise BadRequest(f"top_k_logprobs must be an integer in 0..20, got {top_k!r}")
        if op == "forward":
            return lambda: _trainer(state, run).forward(data, loss_fn, config, top_k_logprobs=top_k)
        return lambda: _trainer(state, run).forward_backward(data, loss_fn, config, top_k_logprobs=top_k)
    if op == "optim_step":
        params = body.get("adam_params")
        if not isinstance(params, dict) or not isinstance(params.get("learning_rate"), int | float):
            raise BadRequest("adam_params must be an object with a numeric learning_rate")
        return lambda: _trainer(state, run).optim_step(params)
    if op == "save_state":
        name = checkpoint_name(str(body.get("name", "")))
        return lambda: _save_state(state, run, name)
    if op in ("load_state", "load_state_with_optimizer"):
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise BadRequest("path must be the path save_state returned")
        with_optimizer = op == "load_state_with_optimizer"
        return lambda: {
            "step": _trainer(state, run).load_state(
                state.resolve_checkpoint(path), with_optimizer=with_optimizer
            )
        }
    if op == "save_weights_for_sampler":
        name = checkpoint_name(str(body.get("name", "")))
        bump = bool(body.get("bump_version", False))
        return lambda: _save_for_sampler(state, run, name, bump)
    raise BadRequest(f"unknown trainer operation {op!r}")


def _init(state: LocalLoopsState, run: LocalRun, rank: int) -> dict[str, Any]:
    run.parked_step = None  # a fresh adapter replaces whatever was parked
    if run.trainer is None:
        run.trainer = state.new_trainer(run)
    run.lora_rank = rank
    return run.trainer.init(rank, seed=run.seed)


def _save_state(state: LocalLoopsState, run: LocalRun, name: str) -> dict[str, Any]:
    _trainer(state, run).save_state(state.checkpoint_dir(run.id, "weights", name))
    return {"mode": "local", "path": state.record_checkpoint(run, "weights", name)}


def _save_for_sampler(state: LocalLoopsState, run: LocalRun, name: str, bump: bool) -> dict[str, Any]:
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
    return {"version": version, "path": path}
