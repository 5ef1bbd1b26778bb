"""The local trainer's compute core: one frozen base model, one PEFT LoRA adapter, one AdamW.

`LoraTrainer` implements the semantics of the Loops trainer ops (protocol notes §3.2, §5.4-5.6) with no
HTTP: `init` (= `/init_trainer_server`), `forward`, `forward_backward`, `optim_step`, `save_state`,
`load_state` and `save_adapter` (for `/save_weights_for_sampler`). The HTTP layer validates requests
with `wire.parse_datums` at submit time and may hand the parsed datums straight to these methods.

Design notes:

* Gradients of several `forward_backward` calls accumulate as raw sums together with their count of
  active tokens; `optim_step` divides once. So split requests equal one request over the union, which is
  what the SDK's auto-chunking assumes (bl/training_client.py:1096-1102).
* LoRA uses alpha = 32 whatever the rank (scale 32/r), as in Thinking Machines' "LoRA Without Regret"
  that Tinker follows: the best learning rate then barely moves with the rank. Dropout is 0 and the model
  stays in eval mode, so training-time logprobs equal the sampler's, which the RL importance ratios need.
* Memory is bounded by a budget, not by the request (see `memory_budget`, `activation_memory`): a
  request's datums are sorted by length and packed into micro-batches whose activations fit the budget,
  measured once per adapter as bytes per token; a sequence too long for the budget alone has its decoder
  layers recomputed in the backward. Text batches are right-padded and run without an attention mask
  (causal attention never lets a real token see the padding after it), which keeps attention on the
  memory-lean fused kernel. The LM head runs only at positions whose logprob is needed, in chunks
  (`lm_head`), so full-vocabulary logits never exist for a whole batch.
* The base weights are shared with the sampler and every other trainer on the same model
  (`shared_base`); a trainer owns only its adapter, optimizer and activations.
* Not thread-safe: the caller runs ops one at a time (the HTTP layer's FIFO worker does). Across
  trainers, `COMPUTE_LOCK` runs one forward/backward at a time, so several runs on one `loops serve`
  never hold several activation budgets at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers.pytorch_utils import Conv1D

from loops_nb.local import lm_head
from loops_nb.local.activation_memory import ActivationCost, checkpointed
from loops_nb.local.bad_request import BadRequest
from loops_nb.local.lora_targets import choose_targets
from loops_nb.local.losses import LOSSES, collate, micro_batches, needed_positions, target_logprobs
from loops_nb.local.memory_budget import resolve_budget, weight_bytes
from loops_nb.local.model_store import auto_dtype
from loops_nb.local.shared_base import BASE_MODELS
from loops_nb.local.vision import VisionInputs, max_positions
from loops_nb.local.wire import (
    ParsedDatum,
    datum_too_long,
    parse_datums,
    resolve_loss_config,
    tensor_data,
    validate_top_k,
)

LORA_ALPHA = 32
ADAM_DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 1.0,
}
# Families whose logits are exactly `lm_head(last_hidden_state)`, so the head can run on selected rows.
_PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3", "phi3"}
_STATE_FILE = "trainer_state.json"
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
        target_modules: list[str] | None = None,
        lora_alpha: int = LORA_ALPHA,
        max_batch_tokens: int = 16384,
        memory_budget_mb: int | None = None,
        max_seq_len: int | None = None,
        seed: int = 0,
    ) -> None:
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:  # as `[compute.local] dtype = "auto"`: bf16 where the hardware is fast at it
            dtype = auto_dtype(self.device)
        self.model_path = str(model_path)
        base: Any = BASE_MODELS.instance(self.model_path, self.device, dtype, bf16_products=bf16_products)
        self._base: Any = base
        self.vision = VisionInputs.load(self.model_path, base)
        """The processor and image token when the model is a vision-language model (image chunks)."""
        self.vocab_size: int = base.get_output_embeddings().weight.shape[0]
        self.model_positions: int | None = max_positions(base.config)
        self.max_length: int | None = self.model_positions
        """Longest datum accepted: the model's positions, or the run's max_seq_len when shorter."""
        self.set_max_seq_len(max_seq_len)
        self.target_modules = list(target_modules) if target_modules else discover_target_modules(base)
        self.lora_alpha = lora_alpha
        self.max_batch_tokens = max_batch_tokens
        self.memory_budget = resolve_budget(memory_budget_mb, weight_bytes(base))
        """Bytes one micro-batch's activations may take (the LM head's chunks take a quarter of it)."""
        self._cost: ActivationCost | None = None
        self.seed = seed
        cfg = base.config
        scaled = any(
            getattr(cfg, a, None) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        )
        self._plain_head = cfg.model_type in _PLAIN_HEAD_TYPES and not scaled
        self._lp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._model: PeftModel | None = None
        self._optimizer: torch.optim.AdamW | None = None
        self._step = 0
        self._tokens = 0  # active tokens (dpo: pairs) accumulated since the last optim_step
        self._normalized: bool | None = None  # mode of the pending gradients; None = no fb since last step

    # ------------------------------------------------------------------------------------------ state

    def set_max_seq_len(self, max_seq_len: int | None) -> None:
        """Refuse datums longer than `max_seq_len` (never more than the model's own positions)."""
        limits = [n for n in (self.model_positions, max_seq_len) if n]
        self.max_length = min(limits) if limits else None

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

    def init(self, lora_rank: int, *, seed: int | None = None) -> dict[str, int]:
        """Start over with a fresh LoRA of `lora_rank` (B = 0, so it equals the base), fresh AdamW, step 0."""
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
            raise BadRequest(f"lora_rank must be a positive integer, got {lora_rank!r}")
        self._new_adapter(
            lora_rank, self.lora_alpha, self.target_modules, self.seed if seed is None else seed
        )
        return {"step": 0, "lora_rank": lora_rank}

    def _new_adapter(self, rank: int, alpha: int, targets: list[str], seed: int) -> None:
        if self._model is not None:  # unload, so a new rank replaces the adapter instead of stacking wrappers
            self._base = self._model.unload()
            self._model = None
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,
            lora_dropout=0.0,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )
        # Seed without touching the caller's RNG. peft 0.21 still calls transformers' deprecated
        # `is_gradient_checkpointing`; the warning is not the user's to act on.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            torch.manual_seed(seed)
            self._model = get_peft_model(self._base, config)  # type: ignore[assignment]
        self._model.eval()
        self.lora_alpha, self.target_modules = alpha, list(targets)
        self._cost = None  # the adapter's own saved tensors are part of the cost
        self._fresh_optimizer()

    def _fresh_optimizer(self) -> None:
        # Hyper-parameters are placeholders: optim_step sets them from each request.
        self._optimizer = torch.optim.AdamW(
            self.lora_parameters(), lr=0.0, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )
        self.model.zero_grad(set_to_none=True)
        self._step, self._tokens, self._normalized = 0, 0, None

    # -------------------------------------------------------------------------------- forward passes

    def forward(
        self,
        data: Sequence[Mapping[str, Any] | ParsedDatum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, Any] | None = None,
        top_k_logprobs: int = 0,
    ) -> dict[str, Any]:
        """Loss and logprobs without touching the gradient buffer; returns `ForwardBackwardOutput` JSON."""
        return self._run(data, loss_fn, loss_fn_config, top_k_logprobs, backward=False)

    def forward_backward(
        self,
        data: Sequence[Mapping[str, Any] | ParsedDatum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, Any] | None = None,
        top_k_logprobs: int = 0,
    ) -> dict[str, Any]:
        """Like `forward`, and accumulate the gradient of the summed loss for the next `optim_step`."""
        return self._run(data, loss_fn, loss_fn_config, top_k_logprobs, backward=True)

    def _run(
        self,
        data: Sequence[Any],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None,
        top_k: int,
        *,
        backward: bool,
    ) -> dict[str, Any]:
        cfg = resolve_loss_config(loss_fn, loss_fn_config)
        top_k = validate_top_k(top_k)
        datums = self._parsed(data, loss_fn)
        normalized = not cfg.get("skip_token_normalization", False)
        if backward and self._normalized is not None and self._normalized != normalized:
            raise BadRequest(
                "token-normalized losses cannot share an optimizer step with skip_token_normalization "
                "gradients; call optim_step first"
            )
        outputs: list[dict[str, Any] | None] = [None] * len(datums)
        total, count = torch.zeros((), dtype=self._lp_dtype, device=self.device), 0
        # Gradients of this request go to fresh buffers and are added to the pending ones only on success,
        # so a request that fails half-way leaves the accumulated gradients as they were.
        plan = self.plan(datums, loss_fn, backward=backward)
        params = self.lora_parameters()
        pending = [p.grad for p in params]
        if backward:
            for p in params:
                p.grad = None
        try:
            with COMPUTE_LOCK, contextlib.nullcontext() if backward else torch.no_grad():
                for rows, recompute in plan:
                    with self._layers_recomputed() if recompute else contextlib.nullcontext():
                        loss, n = self._micro_batch(datums, rows, loss_fn, cfg, top_k, outputs, backward)
                    total, count = total + loss, count + n
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
        metrics = {"loss": mean}
        if not normalized:
            metrics["skip_token_normalization"] = 1.0
        return {"loss": mean, "loss_fn_output_type": loss_fn, "loss_fn_outputs": outputs, "metrics": metrics}

    def plan(
        self, datums: Sequence[ParsedDatum], loss_fn: str, *, backward: bool
    ) -> list[tuple[list[int], bool]]:
        """Micro-batches (datum indices, whether to recompute layers) whose activations fit the budget.

        Datums short enough to fit the budget with every layer's intermediates kept are packed without
        recomputation; longer ones are packed at the recomputed cost. A forward without backward keeps
        no intermediates, so it packs at the recomputed cost too (one layer's transients at a time).
        """
        cost = self.activation_cost()
        plain = min(self.max_batch_tokens, cost.tokens(self.memory_budget, recompute=False))
        lean = min(self.max_batch_tokens, cost.tokens(self.memory_budget, recompute=True))
        group = 2 if loss_fn == "dpo" else 1
        if not backward:
            lengths = [d.length for d in datums]
            return [(rows, False) for rows in micro_batches(lengths, lean, group)]
        units = [list(range(i, min(i + group, len(datums)))) for i in range(0, len(datums), group)]
        long = {i for u in units if max(datums[i].length for i in u) > plain for i in u}
        batches = []
        for recompute, members in (
            (False, [i for i in range(len(datums)) if i not in long]),
            (True, sorted(long)),
        ):
            if members:
                lengths = [datums[i].length for i in members]
                for rows in micro_batches(lengths, lean if recompute else plain, group):
                    batches.append(([members[j] for j in rows], recompute))
        return batches

    def activation_cost(self) -> ActivationCost:
        """Bytes per token a micro-batch keeps for its backward (measured once per adapter)."""
        if self._cost is None:
            lm: Any = self.model.get_base_model()
            text = getattr(lm.config, "text_config", None) or lm.config
            decoder = lm.get_decoder()
            # Saved-tensor hooks are thread-local, so other trainers' work at the same time is not counted.
            self._cost = ActivationCost.measure(
                lambda ids: decoder(input_ids=ids, use_cache=False).last_hidden_state,
                lm,
                layers=int(text.num_hidden_layers),
                hidden=int(text.hidden_size),
                element_bytes=lm.dtype.itemsize,
                device=self.device,
            )
        return self._cost

    def _layers_recomputed(self) -> contextlib.AbstractContextManager[None]:
        lm: Any = self.model.get_base_model()
        return checkpointed(list(lm.get_decoder().layers))

    def _parsed(self, data: Sequence[Any], loss_fn: str) -> list[ParsedDatum]:
        if data and all(isinstance(d, ParsedDatum) for d in data):
            if loss_fn == "dpo" and len(data) % 2:
                raise BadRequest(f"dpo needs an even number of datums, got {len(data)}")
            for i, datum in enumerate(data):
                if self.max_length is not None and datum.length > self.max_length:
                    raise datum_too_long(f"data[{i}]", datum.length, self.max_length)
            return list(data)
        return parse_datums(
            data,
            loss_fn,
            vocab_size=self.vocab_size,
            max_length=self.max_length,
            allow_images=self.vision is not None,
        )

    def _micro_batch(
        self,
        datums: list[ParsedDatum],
        index: list[int],
        loss_fn: str,
        cfg: Mapping[str, Any],
        top_k: int,
        outputs: list[Any],
        backward: bool,
    ) -> tuple[torch.Tensor, int]:
        """One padded forward (+ backward) over `datums[index]`; fills `outputs[index]`; → (loss sum, count)."""
        rows = [datums[i] for i in index]
        batch = collate(rows, self.device, self._lp_dtype)
        assert batch.tokens is not None and batch.target_tokens is not None and batch.real is not None
        lengths = [d.length for d in rows]
        need = (
            batch.real
            if top_k
            else needed_positions(loss_fn, cfg, batch.valid, batch.weights, batch.advantages)
        )
        pos = need.nonzero(as_tuple=True)
        top: tuple[torch.Tensor, torch.Tensor] | None = None
        if pos[0].numel():  # else nothing to compute (e.g. all advantages 0): skip the model entirely
            tokens, extra = batch.tokens, {}
            chunks = [chunk for d in rows for _, chunk in d.images]
            if chunks and self.vision is not None:
                mask = None if min(lengths) == max(lengths) else batch.real.long()
                pixels = self.vision.pixels(chunks, "model_input image")
                extra = self.vision.inputs(tokens, mask, pixels)
                extra.pop("rope_deltas", None)
                logits = self._logits(mask, pos, extra).to(self._lp_dtype)
                picked, top = target_logprobs(logits, batch.target_tokens[pos], top_k)
            elif self._plain_head:
                lm: Any = self.model.get_base_model()
                # No mask: rows are right-padded, and causal attention never lets a real token see the
                # padding after it, so the result is exact and attention stays on the fused kernel.
                hidden = lm.get_decoder()(input_ids=tokens, use_cache=False).last_hidden_state
                head = lm.get_output_embeddings()
                chunk = lm_head.head_chunk(self.memory_budget // 4, self.vocab_size)
                picked, top = lm_head.target_logprobs(
                    hidden[pos],
                    head,
                    batch.target_tokens[pos],
                    chunk=chunk,
                    dtype=self._lp_dtype,
                    top_k=top_k,
                )
            else:
                logits = self._logits(None, pos, {"input_ids": tokens}).to(self._lp_dtype)
                picked, top = target_logprobs(logits, batch.target_tokens[pos], top_k)
            batch.lp = batch.lp.index_put(pos, picked)
        out = LOSSES[loss_fn](batch, cfg)
        if not bool(torch.isfinite(out.loss)):
            raise FloatingPointError(
                f"{loss_fn} loss is not finite ({float(out.loss.detach())}); check the inputs"
            )
        if backward and out.loss.requires_grad:
            out.loss.backward()
        lp_cpu = out.logprobs.float().cpu()
        top_cpu = (top[0].float().cpu(), top[1].cpu()) if top is not None else None
        for j, (i, n) in enumerate(zip(index, lengths, strict=True)):
            entry = {"logprobs": tensor_data(lp_cpu[j, :n])}
            if top_cpu is not None:  # need == real here, so row j's positions are a contiguous run
                start = sum(lengths[:j])
                entry["top_k_token_ids"] = tensor_data(top_cpu[1][start : start + n])
                entry["top_k_logprobs"] = tensor_data(top_cpu[0][start : start + n])
            outputs[i] = entry
        return out.loss.detach(), out.count

    def _logits(
        self, mask: torch.Tensor | None, pos: tuple[torch.Tensor, ...], inputs: Mapping[str, Any]
    ) -> torch.Tensor:
        """Full-model logits [M, V] at the selected positions, for heads that are more than a linear
        layer (soft-capping, scaling) and for image inputs (`inputs`: embeddings and positions)."""
        lm: Any = self.model.get_base_model()
        return lm(attention_mask=mask, use_cache=False, **inputs).logits[pos]

    # ---------------------------------------------------------------------------------- optimisation

    def optim_step(self, adam_params: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
        """Normalise the accumulated gradients, clip, take one AdamW step, zero them; `step += 1`."""
        hp = {**ADAM_DEFAULTS, **{k: v for k, v in (adam_params or {}).items() if v is not None}}
        for key in ADAM_DEFAULTS:
            value = hp[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise BadRequest(f"adam_params[{key!r}] must be a finite non-negative number, got {value!r}")
        params = self.lora_parameters()
        assert self._optimizer is not None
        tokens = self._tokens
        if self._normalized and tokens > 0:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(tokens)
        max_norm = float(hp["grad_clip_norm"]) or math.inf  # 0 disables clipping
        grads = [p for p in params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm)) if grads else 0.0
        if not math.isfinite(norm):
            self.model.zero_grad(set_to_none=True)
            self._tokens, self._normalized = 0, None
            raise FloatingPointError(f"gradient norm is {norm}; the update was skipped and gradients dropped")
        for group in self._optimizer.param_groups:  # hyper-parameters arrive with every step
            group.update(
                lr=float(hp["learning_rate"]),
                betas=(float(hp["beta1"]), float(hp["beta2"])),
                eps=float(hp["eps"]),
                weight_decay=float(hp["weight_decay"]),
            )
        self._optimizer.step()
        self.model.zero_grad(set_to_none=True)
        self._step += 1
        self._tokens, self._normalized = 0, None
        metrics = {
            "grad_norm": norm,
            "learning_rate": float(hp["learning_rate"]),
            "step": float(self._step),
            "tokens": float(tokens),
        }
        return {"metrics": metrics}

    # ------------------------------------------------------------------------------------ checkpoints

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copies of the LoRA weights, keyed as PEFT saves them (no adapter name)."""
        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def lora_config_dict(self) -> dict[str, Any]:
        """The adapter's `LoraConfig` as JSON-able values (what `adapter_config.json` holds)."""
        cfg = self.model.peft_config["default"].to_dict()
        return json.loads(json.dumps(cfg, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))

    def save_adapter(self, path: str | Path) -> None:
        """Write the adapter in PEFT format, so `PeftModel.from_pretrained(base, path)` loads it."""
        with _atomic_dir(Path(path)) as tmp:
            self.model.save_pretrained(str(tmp))

    def save_state(self, path: str | Path) -> None:
        """Save adapter, optimizer, step and RNG under `path` (replaced atomically). Pending grads are not saved."""
        with _atomic_dir(Path(path)) as tmp:
            self.model.save_pretrained(str(tmp / "adapter"))
            assert self._optimizer is not None
            torch.save(self._optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save({"cpu": torch.get_rng_state()}, tmp / "rng.pt")
            state = {
                "format": 1,
                "step": self._step,
                "lora_rank": self.lora_rank,
                "lora_alpha": self.lora_alpha,
                "target_modules": self.target_modules,
                "base_model": self.model_path,
            }
            (tmp / _STATE_FILE).write_text(json.dumps(state, indent=2))

    def load_state(self, path: str | Path, *, with_optimizer: bool, restore_rng: bool = True) -> int:
        """Restore a `save_state` checkpoint; without the optimizer: weights only, fresh AdamW, step 0.
        `restore_rng=False` leaves the process's torch RNG alone (a parked run coming back).

        Returns the step the trainer is now at.
        """
        path = Path(path)
        try:
            state = json.loads((path / _STATE_FILE).read_text())
            weights = load_file(path / "adapter" / "adapter_model.safetensors")
            optim = torch.load(path / "optimizer.pt", weights_only=True) if with_optimizer else None
            rng = torch.load(path / "rng.pt", weights_only=True) if with_optimizer else None
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"no trainer state at {path}: {Path(exc.filename).name} is missing"
            ) from None
        except Exception as exc:
            raise ValueError(f"trainer state at {path} is unreadable: {exc}") from exc
        self._new_adapter(
            int(state["lora_rank"]), int(state["lora_alpha"]), list(state["target_modules"]), self.seed
        )
        result: Any = set_peft_model_state_dict(self.model, weights)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"trainer state at {path} does not fit this model: missing {missing[:3]}, "
                f"unexpected {list(result.unexpected_keys)[:3]}"
            )
        if with_optimizer:
            assert self._optimizer is not None and optim is not None and rng is not None
            self._optimizer.load_state_dict(optim)
            if restore_rng:
                torch.set_rng_state(rng["cpu"])
            self._step = int(state["step"])
        return self._step


def discover_target_modules(model: torch.nn.Module) -> list[str]:
    """LoRA targets of a loaded model (see `lora_targets.choose_targets`)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]
    names = {  # GPT-2 style models use transformers' Conv1D, which PEFT's LoRA also handles
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear | Conv1D) and m is not head
    }
    return choose_targets(names, type(model).__name__)


@contextlib.contextmanager
def _atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp dir next to `path`; on success it replaces `path` (rename), on failure it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
