"""Turn the SDK's `Datum`s, as `/forward` and `/forward_backward` receive them, into the trainer's tensors.

The body is already the SDK's `Datum` model (`op_requests`); this checks what the model alone cannot
(lengths, shapes, token ranges, the inputs each loss needs), naming the datum and key at fault. It is cheap
(no model) because it runs at submit time, where a 422 fails the client at once instead of at the poll.
It also owns the loss-function *contract* (names, required inputs, config defaults); `losses` the maths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from baseten.loops import Datum, EncodedTextChunk, ImageChunk, ModelInput, TensorData

from loops_nb.local.bad_request import BadRequest

IGNORE_INDEX = -100
"""A `target_tokens` entry that contributes no loss and yields a null logprob (Baseten docs)."""

RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "dppo")

# The losses, with their `loss_fn_config` keys and defaults (bl/training_client.py:815-824). `None` from the client means
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

_NUMBER_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "bool"}


@dataclass(kw_only=True)
class LossInputs:
    """The float `loss_fn_inputs` as tensors, shaped like `target_tokens`: [N] for one datum (`ParsedDatum`),
    [B, T] (or [B, T, K] for K-target cross_entropy) once right-padded into a `losses.LossBatch`.

    Float inputs that arrived as null, and padding, are 0.0; nulls where a value is needed are refused.
    """

    weights: torch.Tensor
    """float32: `weights` × `mask` (each defaults to 1), so losses see one per-token factor."""
    logprobs: torch.Tensor | None = None
    """The sampler's logprobs q (RL losses)."""
    advantages: torch.Tensor | None = None
    """Broadcast from shape [1] when sent per datum (RL losses)."""
    ref_logprobs: torch.Tensor | None = None
    """The reference policy's logprobs (dpo)."""


@dataclass(kw_only=True)
class ParsedDatum(LossInputs):
    """One validated datum as tensors (all on CPU; the trainer moves what it needs)."""

    tokens: torch.Tensor
    """int64 [N]; positions covered by image chunks hold -1."""
    target_tokens: torch.Tensor
    """int64 [N] or [N, K] (K only for cross_entropy); -100 means ignored."""
    images: list[ImageChunk] = field(default_factory=list)
    """The datum's image chunks, in order; their positions in `tokens` hold -1."""

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


def check_loss_fn(loss_fn: str) -> None:
    if loss_fn not in LOSS_CONFIG_DEFAULTS:
        raise BadRequest(f"loss_fn {loss_fn!r} is not one of: {', '.join(LOSS_CONFIG_DEFAULTS)}")


def resolve_loss_config(
    loss_fn: str, loss_fn_config: Mapping[str, float | bool] | None
) -> dict[str, float | bool]:
    """Validate `loss_fn` and merge `loss_fn_config` over its defaults; unknown keys are refused."""
    check_loss_fn(loss_fn)
    defaults = LOSS_CONFIG_DEFAULTS[loss_fn]
    if loss_fn_config is None:
        return dict(defaults)
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


def parse_datums(
    data: Sequence[Datum],
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
    check_loss_fn(loss_fn)
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


def tensor_data(values: torch.Tensor) -> TensorData:
    """`values` as the SDK's `TensorData`: flat row-major data, NaN as `None` (JSON has no NaN).

    Unlike `TensorData.from_torch`, floats narrower than float64 are sent as float32 values and NaN as null."""
    values = values.detach().cpu()
    dtype = str(values.dtype).removeprefix("torch.")
    flat = values.reshape(-1)
    if values.is_floating_point() and values.dtype != torch.float64:
        flat = flat.float()
    data = flat.tolist()
    if values.is_floating_point() and bool(torch.isnan(flat).any()):
        data = [None if x != x else x for x in data]
    return TensorData(data=data, dtype=dtype, shape=list(values.shape))


# --------------------------------------------------------------------------------------------- internals


def _parse_datum(
    i: int,
    datum: Datum,
    loss_fn: str,
    *,
    vocab_size: int | None,
    max_length: int | None,
    allow_images: bool,
) -> ParsedDatum:
    where = f"data[{i}]"
    tokens, images = _parse_model_input(where, datum.model_input, allow_images)
    n = len(tokens)
    if n == 0:
        raise BadRequest(f"{where}.model_input: empty; a datum needs at least one token")
    if max_length is not None and n > max_length:  # refused before anything is allocated
        raise BadRequest(
            f"{where}.model_input: {n} tokens exceed this run's limit of {max_length} (its max_seq_len, or "
            "the model's context if smaller); shorten or split the datum, or create the training client "
            "with a larger max_seq_len"
        )
    try:
        token_t = torch.tensor(tokens, dtype=torch.int64)
    except (ValueError, RuntimeError):  # the SDK's model took the ids as ints; one is past int64
        raise BadRequest(f"{where}.model_input: chunk tokens must be 64-bit integers") from None
    bad = token_t < (-1 if images else 0)  # -1 marks image positions
    if vocab_size is not None:
        bad |= token_t >= vocab_size
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        vocab = f"[0, {vocab_size})" if vocab_size is not None else "(ids are non-negative)"
        raise BadRequest(
            f"{where}.model_input: token {tokens[j]} at position {j} is outside the vocabulary {vocab}"
        )

    inputs = datum.loss_fn_inputs
    missing = [k for k in ("target_tokens", *_REQUIRED[loss_fn]) if k not in inputs]
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
    where: str, model_input: ModelInput, allow_images: bool
) -> tuple[list[int], list[ImageChunk]]:
    tokens: list[int] = []
    images: list[ImageChunk] = []
    for c, chunk in enumerate(model_input.chunks):
        if isinstance(chunk, EncodedTextChunk):
            tokens.extend(chunk.tokens)
        elif isinstance(chunk, ImageChunk) and allow_images:
            images.append(chunk)
            tokens.extend([-1] * chunk.expected_tokens)
        else:
            raise BadRequest(
                f"{where}.model_input.chunks[{c}]: image chunks need a vision model; this trainer is text-only"
            )
    return tokens, images


def _tensor(where: str, td: TensorData, *, integer: bool = False) -> torch.Tensor:
    """Decode one `TensorData` (flat or nested `data`, nulls → NaN) into an int64 or float32 tensor."""
    # `TensorData.from_list` sends [N, K] data nested, one list per row.
    data = [v for row in td.data for v in (row if isinstance(row, list) else [row])]
    shape = td.shape
    if any(s < 0 for s in shape) or len(shape) > 2:
        raise BadRequest(f"{where}: shape {shape!r} must be [N] or [N, K]")
    if math.prod(shape) != len(data):
        raise BadRequest(f"{where}: {len(data)} values do not fill shape {shape}")
    if not integer and td.dtype not in _NUMBER_DTYPES:
        raise BadRequest(f"{where}: unsupported dtype {td.dtype!r}")
    try:
        if integer:
            t = torch.tensor(data) if data else torch.zeros(0, dtype=torch.int64)
        else:
            try:
                t = torch.tensor(data, dtype=torch.float32)
            except TypeError:  # nulls (masked positions) → NaN, as TensorData.to_torch does
                t = torch.tensor([math.nan if v is None else v for v in data], dtype=torch.float32)
        t = t.reshape(shape)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise BadRequest(f"{where}: could not read values as numbers ({exc})") from None
    if not integer:
        return t
    # `TensorData.from_list` labels data float32 by default, so judge the values, not the label.
    if t.dtype == torch.bool or (t.is_floating_point() and not bool((t == t.round()).all())):
        raise BadRequest(f"{where}: expected integer token ids, got dtype {td.dtype!r}")
    return t.to(torch.int64)


def _null_to_zero(t: torch.Tensor) -> torch.Tensor:
    """JSON null (NaN here) → 0.0, leaving infinities for the caller to refuse (unlike `nan_to_num`)."""
    return torch.where(torch.isnan(t), torch.zeros_like(t), t)


def _check_length(where: str, t: torch.Tensor, n: int, *, allow_k: bool = False) -> None:
    if t.dim() == 0 or t.dim() > (2 if allow_k else 1):
        allowed = "[N] or [N, K]" if allow_k else "[N]"
        raise BadRequest(f"{where}: shape {list(t.shape)} must be {allowed} with N = model_input length {n}")
    if t.shape[0] != n:
        raise BadRequest(f"{where}: length {t.shape[0]} does not match model_input length {n}")
