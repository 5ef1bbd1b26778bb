"""The local trainer's compute core: one frozen base model, one PEFT LoRA adapter, one AdamW.

`LoraTrainer` implements the Loops trainer ops with no HTTP (`init`, `forward`, `forward_backward`,
`optim_step`, `save_state`, `load_state`, `save_adapter`), taking and answering the SDK's own models.
Gradients accumulate as raw sums with their count of active tokens and `optim_step` divides once, so split
requests equal one request over the union (what the SDK's auto-chunking assumes). The model stays in eval
mode with LoRA dropout 0, so training-time logprobs equal the sampler's. Memory is bounded by a budget,
not the request (`activation_memory`; docs/reference/local_loops.md "Memory and precision"). Not
thread-safe: the HTTP layer's FIFO worker runs ops one at a time, and `COMPUTE_LOCK` runs one trainer's
forward/backward at a time across runs.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from baseten.loops import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    InitTrainerServerResponse,
    OptimStepResponse,
    TensorData,
)
from peft import PeftModel

from loops_nb.local import lm_head
from loops_nb.local.activation_memory import ActivationCost, checkpointed, plan_micro_batches
from loops_nb.local.bad_request import BadRequest
from loops_nb.local.datum_wire import ParsedDatum, parse_datums, resolve_loss_config
from loops_nb.local.image_chunks import VisionInputs, max_positions
from loops_nb.local.kv_cache import cache_is_full_attention
from loops_nb.local.lora_adapter import (
    LORA_ALPHA,
    adapter_state_dict,
    discover_target_modules,
    lora_config_dict,
    new_lora,
)
from loops_nb.local.memory_budget import resolve_budget, weight_bytes
from loops_nb.local.micro_batch import (
    LogprobModel,
    MicroBatch,
    MicroBatchResult,
    has_plain_head,
    prompt_keys,
    run_micro_batch,
)
from loops_nb.local.model_store import auto_dtype
from loops_nb.local.packed_attention import use_packed_attention
from loops_nb.local.shared_base import BASE_MODELS
from loops_nb.local.trainer_checkpoints import (
    load_adapter_weights,
    read_trainer_state,
    write_adapter,
    write_trainer_state,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

COMPUTE_LOCK = threading.Lock()
"""Held by every trainer for one request's forward (and backward), so only one budget is ever in use."""


class LoraTrainer:
    """A LoRA trainer over one base model. Call `init(rank)` before anything else."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        bf16_products: bool = False,
        max_batch_tokens: int = 16384,
        memory_budget_mb: int | None = None,
        max_seq_len: int | None = None,
    ) -> None:
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:  # as `[compute.local] dtype = "auto"`: bf16 where the hardware is fast at it
            dtype = auto_dtype(self.device)
        self.model_path = str(model_path)
        base: PreTrainedModel = BASE_MODELS.instance(
            self.model_path, self.device, dtype, bf16_products=bf16_products
        )
        self._base = base
        self.vision = VisionInputs.load(self.model_path, base)
        """The processor and image token when the model is a vision-language model (image chunks)."""
        self.vocab_size: int = base.get_output_embeddings().weight.shape[0]
        limits = [n for n in (max_positions(base.config), max_seq_len) if n]
        self.max_length = min(limits) if limits else None
        """Longest datum accepted: the model's positions, or the run's max_seq_len when shorter."""
        self.target_modules = discover_target_modules(base)
        self.lora_alpha = LORA_ALPHA  # a loaded state brings its own, with its targets
        self.max_batch_tokens = max_batch_tokens
        self.memory_budget = resolve_budget(memory_budget_mb, weight_bytes(base))
        """Bytes one micro-batch's activations may take (the LM head's chunks take a quarter of it)."""
        self._cost: ActivationCost | None = None
        self._plain_head = has_plain_head(base.config)
        self.share_prefixes = True
        """Rows of a micro-batch that share a prompt run it once (`shared_prefix`); False runs every row whole."""
        # A shared prompt's rows attend to its keys and values (packed under a mask, or expanded): only plain
        # full-attention caches can (Qwen3.5/3.6's linear attention, DeepSeek V4's compressed attention and
        # sliding windows run whole).
        self._can_share = cache_is_full_attention(base.config)
        if self._can_share:  # a packed group's attention then computes only what its mask lets through
            use_packed_attention(base)
        self._lp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._model: PeftModel | None = None
        self._optimizer: torch.optim.AdamW | None = None
        self._step = 0
        self._tokens = 0  # active tokens (dpo: pairs) accumulated since the last optim_step
        self._normalized: bool | None = None  # mode of the pending gradients; None = no fb since last step

    # ------------------------------------------------------------------------------------------ state

    @property
    def step(self) -> int:
        """Number of optim_steps since init (the policy version)."""
        return self._step

    @property
    def has_pending_gradients(self) -> bool:
        """Whether forward_backward gradients wait for an optim_step (they are not in a saved state)."""
        return self._normalized is not None

    @property
    def lora_rank(self) -> int | None:
        return None if self._model is None else int(self._model.peft_config["default"].r)  # type: ignore[attr-defined]

    @property
    def model(self) -> PeftModel:
        if self._model is None:
            raise RuntimeError("the trainer has no adapter yet: call init(lora_rank) first")
        return self._model

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def init(self, lora_rank: int, *, seed: int | None = None) -> InitTrainerServerResponse:
        """Start over with a fresh LoRA of `lora_rank` (B = 0, so it equals the base), fresh AdamW, step 0.

        The rank was checked where it arrived (`op_requests.LoraRank`)."""
        self._new_adapter(lora_rank, self.lora_alpha, self.target_modules, seed or 0)
        return InitTrainerServerResponse(step=0, lora_rank=lora_rank)

    def _new_adapter(self, rank: int, alpha: int, targets: list[str], seed: int) -> None:
        if self._model is not None:  # unload, so a new rank replaces the adapter instead of stacking wrappers
            self._base = self._model.unload()
            self._model = None
        self._model = new_lora(self._base, rank=rank, alpha=alpha, targets=targets, seed=seed)
        self.lora_alpha, self.target_modules = alpha, list(targets)
        self._cost = None  # the adapter's own saved tensors are part of the cost
        # Hyper-parameters are placeholders: each `optim_step` sets them from its request.
        self._optimizer = torch.optim.AdamW(
            self.lora_parameters(), lr=0.0, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )
        self.model.zero_grad(set_to_none=True)
        self._step, self._tokens, self._normalized = 0, 0, None

    # -------------------------------------------------------------------------------- forward passes

    def forward(
        self,
        data: Sequence[Datum] | Sequence[ParsedDatum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, float | bool] | None = None,
        top_k_logprobs: int = 0,
        *,
        backward: bool = False,
    ) -> ForwardBackwardOutput:
        """Loss and logprobs; with `backward` (`forward_backward`), also accumulate the gradient of the
        summed loss for the next `optim_step`, else the gradient buffer is left untouched."""
        cfg = resolve_loss_config(loss_fn, loss_fn_config)
        datums = self._parsed(data, loss_fn)
        normalized = not cfg.get("skip_token_normalization", False)
        if backward and self._normalized is not None and self._normalized != normalized:
            raise BadRequest(
                "token-normalized losses cannot share an optimizer step with skip_token_normalization "
                "gradients; call optim_step first"
            )
        outputs: list[dict[str, TensorData]] = [{} for _ in datums]
        total, count = torch.zeros((), dtype=self._lp_dtype, device=self.device), 0
        computed = tokens = 0
        # Gradients of this request go to fresh buffers and are added to the pending ones only on success,
        # so a request that fails half-way leaves the accumulated gradients as they were.
        plan = self.plan(datums, loss_fn, backward=backward, top_k=top_k_logprobs)
        params = self.lora_parameters()
        pending = [p.grad for p in params]
        if backward:
            for p in params:
                p.grad = None
        try:
            with COMPUTE_LOCK, contextlib.nullcontext() if backward else torch.no_grad():
                for index, recompute in plan:
                    rows = [datums[i] for i in index]
                    job = MicroBatch(
                        rows,
                        loss_fn=loss_fn,
                        loss_config=cfg,
                        top_k=top_k_logprobs,
                        backward=backward,
                        share_prefixes=self._shares_prompts,
                    )
                    with self._layers_recomputed() if recompute else contextlib.nullcontext():
                        result = self._micro_batch(job)
                    for i, entry in zip(index, result.outputs, strict=True):
                        outputs[i] = entry
                    total, count = total + result.loss, count + result.count
                    computed, tokens = computed + result.computed_tokens, tokens + result.total_tokens
        except BaseException:
            if backward:
                for p, g in zip(params, pending, strict=True):
                    p.grad = g
            raise
        if backward:
            for p, g in zip(params, pending, strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad.add_(g)
            self._tokens += count
            self._normalized = normalized
        mean = float(total) / max(count, 1)
        # What shared prompts saved (`shared_prefix`): token positions run, against the datums' tokens.
        metrics = {
            "loss": mean,
            "trainer/computed_tokens": float(computed),
            "trainer/total_tokens": float(tokens),
        }
        if not normalized:
            metrics["skip_token_normalization"] = 1.0
        return ForwardBackwardOutput(
            loss=mean, loss_fn_output_type=loss_fn, loss_fn_outputs=outputs, metrics=metrics
        )

    forward_backward = functools.partialmethod(forward, backward=True)
    """`forward` that also accumulates the gradient for the next `optim_step`."""

    def plan(
        self, datums: Sequence[ParsedDatum], loss_fn: str, *, backward: bool, top_k: int = 0
    ) -> list[tuple[list[int], bool]]:
        """Micro-batches (datum indices, whether to recompute layers) whose activations fit the budget
        (see `activation_memory.plan_micro_batches`); where the rows' prompts will be shared, a prompt's
        rows are kept together and priced as the shared forward runs them."""
        # Only text rows under a plain head share (`LogprobModel`): pricing others as shared would understate.
        shares = self._shares_prompts and self._plain_head and not any(d.images for d in datums)
        return plan_micro_batches(
            [d.length for d in datums],
            self.activation_cost(),
            budget_bytes=self.memory_budget,
            max_tokens=self.max_batch_tokens,
            group=2 if loss_fn == "dpo" else 1,
            backward=backward,
            prompts=prompt_keys(datums, loss_fn, top_k) if shares else None,
        )

    @property
    def _shares_prompts(self) -> bool:
        """Sharing is asked for (`share_prefixes`) and the model's cache allows it."""
        return self.share_prefixes and self._can_share

    def activation_cost(self) -> ActivationCost:
        """Bytes per token a micro-batch keeps for its backward (measured once per adapter)."""
        if self._cost is None:
            self._cost = ActivationCost.of_decoder(self.model.get_base_model(), self.device)
        return self._cost

    def _layers_recomputed(self) -> contextlib.AbstractContextManager[None]:
        lm: Any = self.model.get_base_model()
        return checkpointed(list(lm.get_decoder().layers))

    def _parsed(self, data: Sequence[Datum] | Sequence[ParsedDatum], loss_fn: str) -> list[ParsedDatum]:
        parsed = [d for d in data if isinstance(d, ParsedDatum)]
        if data and len(parsed) == len(data):
            return parsed  # parsed at submit (`trainer_ops.prepare`), against this run's limits
        datums = [d for d in data if isinstance(d, Datum)]
        limits = {"vocab_size": self.vocab_size, "max_length": self.max_length}
        return parse_datums(datums, loss_fn, **limits, allow_images=self.vision is not None)

    def _micro_batch(self, job: MicroBatch) -> MicroBatchResult:
        """One micro-batch on the adapter as it is now (the budget and model may change between calls)."""
        model = LogprobModel(
            lm=self.model.get_base_model(),
            device=self.device,
            dtype=self._lp_dtype,
            plain_head=self._plain_head,
            head_chunk=lm_head.head_chunk(self.memory_budget // 4, self.vocab_size),
            vision=self.vision,
        )
        return run_micro_batch(model, job)

    # ---------------------------------------------------------------------------------- optimisation

    def optim_step(self, adam_params: AdamParams | None = None) -> OptimStepResponse:
        """Normalise the accumulated gradients, clip, take one AdamW step, zero them; `step += 1`."""
        hp = adam_params or AdamParams()  # checked at submit (`op_requests.OptimStep`)
        params = self.lora_parameters()
        assert self._optimizer is not None
        tokens = self._tokens
        if self._normalized and tokens > 0:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(tokens)
        max_norm = hp.grad_clip_norm or math.inf  # 0 disables clipping
        grads = [p for p in params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm)) if grads else 0.0
        if not math.isfinite(norm):
            self.model.zero_grad(set_to_none=True)
            self._tokens, self._normalized = 0, None
            raise FloatingPointError(f"gradient norm is {norm}; the update was skipped and gradients dropped")
        for group in self._optimizer.param_groups:
            group.update(
                lr=hp.learning_rate, betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=hp.weight_decay
            )
        self._optimizer.step()
        self.model.zero_grad(set_to_none=True)
        self._step += 1
        self._tokens, self._normalized = 0, None
        metrics = {
            "grad_norm": norm,
            "learning_rate": hp.learning_rate,
            "step": float(self._step),
            "tokens": float(tokens),
        }
        return OptimStepResponse(metrics=metrics)

    # ------------------------------------------------------------------------------------ checkpoints

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copies of the LoRA weights, keyed as PEFT saves them (no adapter name)."""
        return adapter_state_dict(self.model)

    def lora_config_dict(self) -> dict[str, Any]:
        """The adapter's `LoraConfig` as JSON-able values (what `adapter_config.json` holds)."""
        return lora_config_dict(self.model)

    def save_adapter(self, path: str | Path) -> None:
        """Write the adapter in PEFT format, so `PeftModel.from_pretrained(base, path)` loads it."""
        write_adapter(Path(path), self.model)

    def save_state(self, path: str | Path) -> None:
        """Save adapter, optimizer, step and RNG under `path` (replaced atomically). Pending grads are not saved."""
        model = self.model
        assert self._optimizer is not None
        meta = {
            "step": self._step,
            "lora_rank": self.lora_rank,
            "lora_alpha": self.lora_alpha,
            "target_modules": self.target_modules,
            "base_model": self.model_path,
        }
        write_trainer_state(Path(path), model, self._optimizer, meta)

    def load_state(self, path: str | Path, *, with_optimizer: bool, restore_rng: bool = True) -> int:
        """Restore a `save_state` checkpoint and return the step it is at; without the optimizer: weights only,
        fresh AdamW, step 0. `restore_rng=False` leaves the process's torch RNG alone (a parked run's return)."""
        path = Path(path)
        saved = read_trainer_state(path, with_optimizer=with_optimizer)
        meta = saved.meta
        # The seed is moot: the saved weights replace the fresh adapter's.
        self._new_adapter(int(meta["lora_rank"]), int(meta["lora_alpha"]), list(meta["target_modules"]), 0)
        load_adapter_weights(self.model, saved.weights, path)
        if with_optimizer:
            assert self._optimizer is not None and saved.optimizer is not None and saved.rng is not None
            self._optimizer.load_state_dict(saved.optimizer)
            if restore_rng:
                torch.set_rng_state(saved.rng["cpu"])
            self._step = int(meta["step"])
        return self._step
