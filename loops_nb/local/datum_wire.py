"""Parse and validate the `Datum` JSON that `baseten-loops` sends to `/forward` and `/forward_backward`.

The SDK serialises each `Datum` with `model_dump(mode="json")` (protocol notes §5.1-5.4): a `model_input`
of chunks plus `loss_fn_inputs`, a dict of `TensorData` (`{"data", "dtype", "shape"}`) whose `data` is
normally flat but may be nested, with JSON `null` for masked float positions. This module turns that into
tensors and rejects what the trainer cannot use, naming the datum and key at fault.

It is deliberately cheap (no model, only torch tensor construction) because the HTTP layer runs it at
submit time: a 422 there fails the client at once, whereas an error found later only surfaces when the
operation is polled. It also owns the loss-function *contract* (names, required inputs, config defaults);
`losses.py` owns the maths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from loops_nb.local.bad_request import BadRequest

IGNORE_INDEX = -100
"""A `target_tokens` entry that contributes no loss and yields a null logprob (Baseten docs)."""

RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "dppo")
LOSS_FNS = ("cross_entropy", *RL_LOSSES, "dpo")

# `loss_fn_config` keys and defaults per loss (bl/training_client.py:815-824). `None` from the client means
# "all defaults"; any other key is refused so a typo never silently trains with the default.
LOSS_CONFIG_DEFAULTS: dict[str, dict[str, float | bool]] = {
    "cross_entropy": {"skip_token_normalization": False},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "dppo": {"dppo_mask_high": 0.2, "dppo_mask_low": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3},
    "dpo": {"beta": 0.1, "label_smoothing": 0.0},
}

# Required / optional float inputs besides `target_tokens` (protocol §5.4).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    **{name: ("logprobs", "advantages") for name in RL_LOSSES},
    "dpo": ("weights", "ref_logprobs"),
}

MAX_TOP_K_LOGPROBS = 20
"""The SDK documents `top_k_logprobs` as 0 through 20 (bl/training_client.py:834-836)."""

_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float64"}
_INT_DTYPES = {"int64", "int32", "int8"}


@dataclass
class ParsedDatum:
    """One validated datum as tensors (all on CPU; the trainer moves what it needs).

    `weights` folds `weights` and `mask` together (each defaults to 1), so losses see one per-token factor.
    Float inputs that arrived as null are 0.0 here; nulls where a value is actually needed are refused.
    """

    tokens: torch.Tensor
    """int64 [N]; positions covered by image chunks hold -1."""
    target_tokens: torch.Tensor
    """int64 [N] or [N, K] (K only for cross_entropy); -100 means ignored."""
    weights: torch.Tensor
    """float32, same shape as `target_tokens`."""
    logprobs: torch.Tensor | None = None
    """float32 [N]: the sampler's logprobs q (RL losses)."""
    advantages: torch.Tensor | None = None
    """float32 [N]: broadcast from shape [1] when sent per datum."""
    ref_logprobs: torch.Tensor | None = None
    """float32 [N]: the reference policy's logprobs (dpo)."""
    images: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """(token offset, raw chunk) for image chunks, kept for a vision extension."""

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


def resolve_loss_config(loss_fn: str, loss_fn_config: Mapping[str, Any] | None) -> dict[str, float | bool]:
    """Validate `loss_fn` and merge `loss_fn_config` over its defaults; unknown keys are refused."""
    if not isinstance(loss_fn, str) or loss_fn not in LOSS_CONFIG_DEFAULTS:
        raise BadRequest(f"loss_fn {loss_fn!r} is not one of: {', '.join(LOSS_FNS)}")
    defaults = LOSS_CONFIG_DEFAULTS[loss_fn]
    if loss_fn_config is None:
        return dict(defaults)
    if not isinstance(loss_fn_config, Mapping):
        raise BadRequest(f"loss_fn_config must be an object or null, got {type(loss_fn_config).__name__}")
    unknown = sorted(set(loss_fn_config) - set(defaults))
    if unknown:
        valid = ", ".join(defaults) or "none"
        raise BadRequest(f"loss_fn_config for {loss_fn!r}: unknown key(s) {unknown}; valid keys: {valid}")
    out = dict(defaults)
    for key, value in loss_fn_config.items():
        if isinstance(defaults[key], bool):
            if not isinstance(value, bool):
                raise BadRequest(f"loss_fn_config[{key!r}] must be a boolean, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise BadRequest(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
        out[key] = value
    if "clip_low_threshold" in out and not 0 <= out["clip_low_threshold"] <= out["clip_high_threshold"]:
        raise BadRequest(
            "loss_fn_config: need 0 <= clip_low_threshold <= clip_high_threshold, got "
            f"{out['clip_low_threshold']} and {out['clip_high_threshold']}"
        )
    return out


def validate_top_k(top_k_logprobs: Any) -> int:
    if isinstance(top_k_logprobs, bool) or not isinstance(top_k_logprobs, int):
        raise BadRequest(f"top_k_logprobs must be an integer, got {top_k_logprobs!r}")
    if not 0 <= top_k_logprobs <= MAX_TOP_K_LOGPROBS:
        raise BadRequest(f"top_k_logprobs must be between 0 and {MAX_TOP_K_LOGPROBS}, got {top_k_logprobs}")
    return top_k_logprobs


def parse_datums(
    data: Sequence[Mapping[str, Any]],
    loss_fn: str,
    *,
    vocab_size: int | None = None,
    max_length: int | None = None,
    allow_images: bool = False,
) -> list[ParsedDatum]:
    """Turn the wire datums into `ParsedDatum`s, checking inputs, shapes and token ranges for `loss_fn`.

    Raises `BadRequest` with the datum index and key, for example
    "data[3].loss_fn_inputs['weights']: length 7 does not match model_input length 9".
    """
    if not isinstance(loss_fn, str) or loss_fn not in LOSS_CONFIG_DEFAULTS:
        raise BadRequest(f"loss_fn {loss_fn!r} is not one of: {', '.join(LOSS_FNS)}")
    if not isinstance(data, Sequence) or isinstance(data, str | bytes):
        raise BadRequest(f"data must be a list of datums, got {type(data).__name__}")
    if not data:
        raise BadRequest("data is empty: send at least one datum")
    if loss_fn == "dpo" and len(data) % 2:
        raise BadRequest(
            f"dpo needs interleaved (chosen, rejected) pairs, so an even number of datums; got {len(data)}"
        )
    parsed = [
        _parse_datum(i, d, loss_fn, vocab_size=vocab_size, max_length=max_length, allow_images=allow_images)
        for i, d in enumerate(data)
    ]
    if loss_fn == "cross_entropy":
        # One padded [B, T, K] gather serves the whole batch, and the SDK documents the same rule.
        ranks = {(p.target_tokens.dim(), p.target_tokens.shape[1:]) for p in parsed}
        if len(ranks) > 1:
            raise BadRequest(
                "data: every datum's loss_fn_inputs['target_tokens'] must have the same rank and K, got "
                + ", ".join(sorted({str([*shape]) for _, shape in ranks}))
            )
    return parsed


def tensor_data(values: torch.Tensor) -> dict[str, Any]:
    """Encode a tensor as `TensorData` JSON: flat row-major data, NaN written as `null` (JSON has no NaN)."""
    values = values.detach().cpu()
    dtype = str(values.dtype).removeprefix("torch.")
    flat = values.reshape(-1)
    if values.is_floating_point():
        nan = torch.isnan(flat)
        if values.dtype != torch.float64:
            flat = flat.float()
        data = flat.tolist()
        if bool(nan.any()):
            data = [None if x != x else x for x in data]
    else:
        data = flat.tolist()
    return {"data": data, "dtype": dtype, "shape": list(values.shape)}


# --------------------------------------------------------------------------------------------- internals


def datum_too_long(where: str, length: int, limit: int) -> BadRequest:
    """The refusal of a datum longer than the run accepts (checked before anything is allocated)."""
    return BadRequest(
        f"{where}.model_input: {length} tokens exceed this run's limit of {limit} (its max_seq_len, or the "
        "model's context if smaller); shorten or split the datum, or create the training client with a "
        "larger max_seq_len"
    )


def _parse_datum(
    i: int,
    datum: Mapping[str, Any],
    loss_fn: str,
    *,
    vocab_size: int | None,
    max_length: int | None,
    allow_images: bool,
) -> ParsedDatum:
    where = f"data[{i}]"
    if not isinstance(datum, Mapping):
        raise BadRequest(f"{where}: expected an object, got {type(datum).__name__}")
    tokens, images = _parse_model_input(where, datum.get("model_input"), allow_images)
    n = len(tokens)
    if n == 0:
        raise BadRequest(f"{where}.model_input: empty; a datum needs at least one token")
    if max_length is not None and n > max_length:
        raise datum_too_long(where, n, max_length)
    try:
        token_t = torch.tensor(tokens)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        token_t = torch.zeros(0)
    if token_t.dtype != torch.int64 or token_t.dim() != 1:
        raise BadRequest(f"{where}.model_input: chunk tokens must be lists of integers")
    bad = token_t < (-1 if images else 0)  # -1 marks image positions
    if vocab_size is not None:
        bad |= token_t >= vocab_size
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        vocab = f"[0, {vocab_size})" if vocab_size is not None else "(ids are non-negative)"
        raise BadRequest(
            f"{where}.model_input: token {tokens[j]} at position {j} is outside the vocabulary {vocab}"
        )

    inputs = datum.get("loss_fn_inputs") or {}
    if not isinstance(inputs, Mapping):
        raise BadRequest(f"{where}.loss_fn_inputs: expected an object, got {type(inputs).__name__}")
    missing = [k for k in ("target_tokens", *_REQUIRED[loss_fn]) if inputs.get(k) is None]
    if missing:
        raise BadRequest(f"{where}.loss_fn_inputs: {loss_fn} needs {missing[0]!r}, which is missing")

    key = f"{where}.loss_fn_inputs"
    target = _tensor(f"{key}['target_tokens']", inputs["target_tokens"], integer=True)
    if target.dim() == 2 and loss_fn != "cross_entropy":
        raise BadRequest(f"{key}['target_tokens']: shape [N, K] is only supported by cross_entropy")
    _check_length(f"{key}['target_tokens']", target, n, allow_k=True)
    bad = (target < 0) & (target != IGNORE_INDEX)
    if vocab_size is not None:
        bad |= target >= vocab_size
    if bool(bad.any()):
        value = int(target[bad][0])
        limit = f"[0, {vocab_size})" if vocab_size is not None else "non-negative"
        raise BadRequest(f"{key}['target_tokens']: token {value} must be {limit} or {IGNORE_INDEX} (ignored)")

    weights = torch.ones(target.shape, dtype=torch.float32)
    factor_keys = ("weights",) if loss_fn in ("cross_entropy", "dpo") else ("weights", "mask")
    for name in factor_keys:
        if inputs.get(name) is None:
            continue
        w = _tensor(f"{key}[{name!r}]", inputs[name])
        if w.shape != target.shape:
            _check_length(f"{key}[{name!r}]", w, n, allow_k=True)
            raise BadRequest(
                f"{key}[{name!r}]: shape {list(w.shape)} does not match target_tokens shape {list(target.shape)}"
            )
        weights = weights * _null_to_zero(w)  # a null weight means "masked"
    if not bool(torch.isfinite(weights).all()):
        raise BadRequest(f"{key}['weights']: values must be finite")

    out = ParsedDatum(tokens=token_t, target_tokens=target, weights=weights, images=images)
    valid = (target != IGNORE_INDEX) & (weights != 0)
    if loss_fn in RL_LOSSES:
        adv = _tensor(f"{key}['advantages']", inputs["advantages"])
        if adv.numel() == 1 and adv.dim() <= 1:
            adv = adv.reshape(1).expand(n).clone()  # per-datum scalar advantage (bl/rl_metrics.py:440-448)
        _check_length(f"{key}['advantages']", adv, n)
        adv = _null_to_zero(adv)
        if not bool(torch.isfinite(adv).all()):
            raise BadRequest(f"{key}['advantages']: values must be finite")
        out.advantages = adv
        valid = valid & (adv != 0)
    for name in ("logprobs", "ref_logprobs"):
        if name not in _REQUIRED[loss_fn]:
            continue
        values = _tensor(f"{key}[{name!r}]", inputs[name])
        _check_length(f"{key}[{name!r}]", values, n)
        # Nulls/infs are fine where the position is inactive (zeroed); where it is active they would poison
        # the loss, so refuse them here rather than fail mid-step.
        bad = ~torch.isfinite(values) & valid
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            raise BadRequest(f"{key}[{name!r}]: null or non-finite value at active position {j}")
        setattr(out, name, torch.where(torch.isfinite(values), values, torch.zeros_like(values)))
    return out


def _parse_model_input(
    where: str, model_input: Any, allow_images: bool
) -> tuple[list[int], list[tuple[int, dict[str, Any]]]]:
    if not isinstance(model_input, Mapping) or not isinstance(model_input.get("chunks"), list):
        raise BadRequest(f"{where}.model_input: expected an object with a 'chunks' list")
    tokens: list[int] = []
    images: list[tuple[int, dict[str, Any]]] = []
    for c, chunk in enumerate(model_input["chunks"]):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, Mapping) else None
        if kind == "encoded_text":
            toks = chunk.get("tokens")
            if not isinstance(toks, list):
                raise BadRequest(f"{where}.model_input.chunks[{c}].tokens: expected a list of integers")
            tokens.extend(toks)
        elif kind == "image":
            if not allow_images:
                raise BadRequest(
                    f"{where}.model_input.chunks[{c}]: image chunks need a vision model; this trainer is text-only"
                )
            count = chunk.get("expected_tokens")
            if type(count) is not int or count <= 0:
                raise BadRequest(
                    f"{where}.model_input.chunks[{c}].expected_tokens: expected a positive integer"
                )
            images.append((len(tokens), dict(chunk)))
            tokens.extend([-1] * count)
        else:
            raise BadRequest(f"{where}.model_input.chunks[{c}]: unsupported chunk type {kind!r}")
    return tokens, images


def _tensor(where: str, td: Any, *, integer: bool = False) -> torch.Tensor:
    """Decode one `TensorData` (flat or nested `data`, nulls → NaN) into an int64 or float32 tensor."""
    if not isinstance(td, Mapping) or "data" not in td:
        raise BadRequest(f"{where}: expected TensorData {{'data', 'dtype', 'shape'}}")
    data = td["data"]
    if not isinstance(data, list):
        raise BadRequest(f"{where}: 'data' must be a list")
    if data and isinstance(data[0], list):
        data = _flatten(where, data)
    shape = td.get("shape")
    if shape is None:
        shape = [len(data)]
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape) or len(shape) > 2:
        raise BadRequest(f"{where}: shape {shape!r} must be [N] or [N, K]")
    if math.prod(shape) != len(data):
        raise BadRequest(f"{where}: {len(data)} values do not fill shape {shape}")
    dtype = td.get("dtype", "int64" if integer else "float32")
    try:
        if integer:
            # `TensorData.from_list` labels data float32 by default, so judge the values, not the label.
            t = torch.tensor(data) if data else torch.zeros(0, dtype=torch.int64)
            if t.dtype == torch.bool or (t.is_floating_point() and not bool((t == t.round()).all())):
                raise BadRequest(f"{where}: expected integer token ids, got dtype {dtype!r}")
            return t.to(torch.int64).reshape(shape)
        if not isinstance(dtype, str) or dtype not in _FLOAT_DTYPES | _INT_DTYPES | {"bool"}:
            raise BadRequest(f"{where}: unsupported dtype {dtype!r}")
        try:
            t = torch.tensor(data, dtype=torch.float32)
        except TypeError:  # nulls (masked positions) → NaN, as TensorData.to_torch does
            t = torch.tensor([math.nan if v is None else v for v in data], dtype=torch.float32)
        return t.reshape(shape)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(f"{where}: could not read values as numbers ({exc})") from None


def _null_to_zero(t: torch.Tensor) -> torch.Tensor:
    """JSON null (NaN here) → 0.0, leaving infinities for the caller to refuse (unlike `nan_to_num`)."""
    return torch.where(torch.isnan(t), torch.zeros_like(t), t)


def _flatten(where: str, nested: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for row in nested:
        if isinstance(row, list):
            flat.extend(_flatten(where, row))
        else:
            flat.append(row)
    return flat


def _check_length(where: str, t: torch.Tensor, n: int, *, allow_k: bool = False) -> None:
    if t.dim() == 0 or t.dim() > (2 if allow_k else 1):
        allowed = "[N] or [N, K]" if allow_k else "[N]"
        raise BadRequest(f"{where}: shape {list(t.shape)} must be {allowed} with N = model_input length {n}")
    if t.shape[0] != n:
        raise BadRequest(f"{where}: length {t.shape[0]} does not match model_input length {n}")
