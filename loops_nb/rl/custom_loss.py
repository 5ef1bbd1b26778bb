"""Your own RL loss, through the SDK's `forward_backward_custom` (the `custom-loss` extra).

`[training] loss = "module:function"` (or the function itself, from Python) names a
`(data: list[Datum], logprobs: list[Tensor]) -> loss | (loss, metrics)` function. The trainer applies exactly
its gradient and never normalises it, so the whole step's datums go to one call and the function divides
itself (`mean_over_active_tokens`, as the built-in losses do). docs/reference/vision_and_custom_loss.md
says what the datums carry and what runs; `importance_sampling` is the built-in written as a custom loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from loops_nb.errors import ConfigError

if TYPE_CHECKING:
    from baseten.loops import Datum
    from torch import Tensor

REFERENCE_ATTRIBUTE = "loops_nb_reference_logprobs"
"""Set (by `uses_reference_logprobs`) on a loss that needs `ref_logprobs` in each datum."""

BUILTIN_LOSSES = ("importance_sampling", "ppo", "cispo")

CustomLoss = Callable[[list[Any], list[Any]], Any]
"""`(data, logprobs) -> loss` or `(loss, metrics)`."""


def uses_reference_logprobs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a loss that reads `ref_logprobs`: the base model's logprob of each target token.

    The run then scores every datum with the policy of version 0 (the LoRA before any update, which equals
    the base model) and adds `ref_logprobs` to its `loss_fn_inputs` before calling the loss.
    """
    setattr(fn, REFERENCE_ATTRIBUTE, True)
    return fn


def needs_reference_logprobs(fn: object) -> bool:
    return bool(getattr(fn, REFERENCE_ATTRIBUTE, False))


def loss_name(loss: str | Callable[..., Any]) -> str:
    """How a loss is written in the run's config.json: its `module:qualname` for a callable."""
    if isinstance(loss, str):
        return loss
    module = getattr(loss, "__module__", None) or "?"
    return f"{module}:{getattr(loss, '__qualname__', type(loss).__name__)}"


def resolve_custom_loss(
    loss: str | Callable[..., Any], options: dict[str, float] | None = None
) -> SdkLoss | None:
    """The SDK-shaped loss for `[training] loss`, or None for a built-in loss name.

    A custom loss gets `[training] loss_config` as keyword arguments (`loss_config = {beta = 0.1}`).
    """
    if isinstance(loss, str):
        if ":" not in loss:
            return None
        from loops_nb.episodes import import_object

        fn = import_object(loss, "training.loss")
        if not callable(fn):
            raise ConfigError(f"training.loss = {loss!r} is not a function")
    elif callable(loss):
        fn = loss
    else:
        raise ConfigError(f"training.loss must be a loss name, `module:function` or a callable, got {loss!r}")
    if options:
        reference = needs_reference_logprobs(fn)
        fn = partial(fn, **options)
        setattr(fn, REFERENCE_ATTRIBUTE, reference)
    return SdkLoss(fn)


@dataclass(frozen=True)
class TrainingLoss:
    """The loss a run trains with, chosen once from `[training] loss` and `loss_config`: a loss built into
    Loops (sent by name to `forward_backward`) or a custom one (run through `forward_backward_custom`)."""

    name: str
    """The built-in loss's name, or `custom`."""
    config: dict[str, float] = field(default_factory=dict)
    """A built-in loss's `loss_fn_config` (a custom loss has it bound as keyword arguments)."""
    custom: SdkLoss | None = None

    @classmethod
    def of(cls, loss: str | Callable[..., Any], loss_config: dict[str, float] | None = None) -> TrainingLoss:
        custom = resolve_custom_loss(loss, loss_config)
        if custom is not None:
            return cls("custom", {}, custom)
        assert isinstance(loss, str)  # resolve_custom_loss returns None only for a built-in name
        return cls(loss, dict(loss_config or {}))

    @property
    def needs_reference(self) -> bool:
        """Whether each step also scores `ref_logprobs` with the version-0 policy."""
        return self.custom is not None and needs_reference_logprobs(self.custom)


def unknown_loss_problem(loss: str | Callable[..., Any]) -> str | None:
    """Why a `[training] loss` string names no loss (None when it is a built-in name, `module:function` or a
    callable)."""
    if isinstance(loss, str) and loss not in BUILTIN_LOSSES and ":" not in loss:
        return f"training.loss = {loss!r}: use one of {sorted(BUILTIN_LOSSES)} or `module:function`"
    return None


class SdkLoss:
    """A user loss in the SDK's shape, `(data, logprobs) -> (loss, metrics)`: metrics become `custom/<key>`, and
    `custom/loss` is the function's own value (the trainer's is the linear surrogate's). The SDK's custom path
    lets only `target_tokens` and `weights` travel, so the run sends bare datums and `for_batch(full)` hands
    the function the step's full ones in the same order."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.function = fn
        inner = fn.func if isinstance(fn, partial) else fn
        self.name = loss_name(inner)
        self.__name__ = getattr(inner, "__name__", self.name)
        self.__qualname__ = getattr(inner, "__qualname__", self.name)
        self.__module__ = getattr(inner, "__module__", __name__)
        setattr(self, REFERENCE_ATTRIBUTE, needs_reference_logprobs(fn))

    def for_batch(
        self, full: Sequence[Any]
    ) -> Callable[[list[Any], list[Any]], tuple[Any, dict[str, float]]]:
        """The callable to pass to `forward_backward_custom(bare, ...)`, reading `full` instead of `bare`."""

        def call(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
            if len(data) != len(full):
                raise ValueError(f"the SDK passed {len(data)} datums to the loss, the step has {len(full)}")
            return self(list(full), logprobs)

        return call

    def __call__(self, data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        import torch

        out = self.function(data, logprobs)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(
                f"custom loss {self.name} must return a scalar torch tensor (optionally with a metrics "
                f"dict), got {type(loss).__name__}"
            )
        if not loss.requires_grad:
            raise ValueError(
                f"custom loss {self.name} returned a tensor that does not depend on the logprobs"
            )
        named = {f"custom/{k}": float(v) for k, v in dict(metrics or {}).items()}
        named["custom/loss"] = float(loss.detach())
        return loss.reshape(()), named


def bare_datum(datum: Datum) -> Datum:
    """`datum` with only its `target_tokens`: what the SDK's custom path accepts (the SDK then sends the
    trainer all-zero weights for the logprob forward)."""
    return datum.model_copy(
        update={"loss_fn_inputs": {"target_tokens": datum.loss_fn_inputs["target_tokens"]}}
    )


# ------------------------------------------------------------------------------------- loss helpers


def rl_inputs(datum: Datum) -> dict[str, Tensor]:
    """A datum's `loss_fn_inputs` as torch tensors: `target_tokens`, `logprobs` (q), `advantages`,
    `mask` (1 where the token was sampled, so it trains) and `ref_logprobs` when present."""
    import torch

    out: dict[str, Tensor] = {}
    for name, td in datum.loss_fn_inputs.items():
        t = td.to_torch() if hasattr(td, "to_torch") else torch.tensor(td)
        out[name] = t if name == "target_tokens" else torch.nan_to_num(t.float(), nan=0.0)
    n = out["target_tokens"].shape[0]
    if "mask" not in out:
        out["mask"] = out.get("weights", torch.ones(n))
    if "advantages" in out and out["advantages"].numel() == 1:
        out["advantages"] = out["advantages"].reshape(1).expand(n)
    return out


def mean_over_active_tokens(per_token: Sequence[Any], active: Sequence[Any]) -> Any:
    """Σ over datums and active positions of `per_token`, divided by the number of active positions:
    the normalisation the built-in losses get from the trainer (their gradient sums, optim_step divides)."""
    import torch

    total = sum(
        (torch.where(a, t, torch.zeros_like(t)).sum() for t, a in zip(per_token, active, strict=True))
    )
    count = sum(int(a.sum()) for a in active)
    return total / max(count, 1)


def importance_sampling(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
    """The built-in `importance_sampling` loss as a custom one: `−exp(lp − q)·A` per sampled token,
    averaged over the step's active tokens (A ≠ 0 and sampled)."""
    import torch

    per_token, active = [], []
    for datum, lp in zip(data, logprobs, strict=True):
        x = rl_inputs(datum)
        per_token.append(-torch.exp(lp - x["logprobs"]) * x["advantages"] * x["mask"])
        active.append((x["target_tokens"] != -100) & (x["mask"] != 0) & (x["advantages"] != 0))
    return mean_over_active_tokens(per_token, active), {}


def kl_to_reference(beta: float = 0.05) -> CustomLoss:
    """Importance sampling plus `beta` × KL(policy ‖ base) on the sampled tokens.

    The KL uses the k3 estimator `exp(ref − lp) − (ref − lp) − 1` (≥ 0, unbiased for KL(π‖ref) under samples
    of π), with `ref` the base model's logprob of each token. It keeps the policy near the base model, which
    no built-in loss does (`dro` and `dppo` regularise towards the *sampler*, one step behind).
    """
    import torch

    @uses_reference_logprobs
    def loss(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        pg, kl, active = [], [], []
        for datum, lp in zip(data, logprobs, strict=True):
            x = rl_inputs(datum)
            if "ref_logprobs" not in x:
                raise ValueError("kl_to_reference needs ref_logprobs in each datum")
            pg.append(-torch.exp(lp - x["logprobs"]) * x["advantages"] * x["mask"])
            log_ratio = x["ref_logprobs"] - lp
            kl.append((torch.exp(log_ratio) - log_ratio - 1) * x["mask"])
            # The KL applies to every sampled token, even where the advantage is 0.
            active.append((x["target_tokens"] != -100) & (x["mask"] != 0))
        pg_loss = mean_over_active_tokens(pg, active)
        kl_mean = mean_over_active_tokens(kl, active)
        return pg_loss + beta * kl_mean, {"kl_to_reference": float(kl_mean.detach()), "beta": beta}

    loss.__qualname__ = f"kl_to_reference(beta={beta})"
    return loss
