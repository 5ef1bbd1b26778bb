"""The trainer transport: training steps, publishing the policy to the sampler, checkpoints.

All through the SDK's TrainingClient, on any scope. The sampling client is swapped atomically on
publish; attempts read `policy.sampling_client` and `policy.version` at the moment they sample, so an
async run knows exactly which policy produced each token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from loops_nb.rl.custom_loss import TrainingLoss, bare_datum
from loops_nb.rl.datums import SequenceDatum, token_batches

if TYPE_CHECKING:
    from baseten.loops import AdamParams, Datum, SamplingClient, TrainingClient

FORWARD_BACKWARD_TOKENS = 32768
"""Tokens per forward_backward request; one optimizer step may span several."""


def run_is_gone(exc: BaseException) -> bool:
    """True when a sampling error says the run's Loops is gone, not that one attempt failed.

    410: the server restarted and lost the run's trainer state (it says so; the SDK does not retry it). A
    connection error: the SDK raises one only after retrying for its whole ready window, so the server has
    been unreachable for minutes. Either way every later attempt would fail the same way, and the trainer's
    next call would too, only later: the run stops at the end of the step instead of discarding steps.
    """
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 410
    return isinstance(exc, httpx.ConnectError)


class Policy:
    """The run's current policy: a trainer behind it and a sampling client in front of it."""

    def __init__(self, training_client: TrainingClient, base_model: str) -> None:
        self.training_client = training_client
        self.base_model = base_model
        self._sampling_client: SamplingClient | None = None
        self.version = 0
        """The trainer step of the published policy (0: the base model, before any publish)."""
        self._reference: SamplingClient | None = None
        self.trainer_steps = 0
        """Optimizer steps the trainer has applied: the version the next publish serves."""
        self.lost: Exception | None = None
        """The first sampling error that means the run's Loops is gone (`run_is_gone`), else None."""

    def sampling_failed(self, exc: Exception) -> None:
        """Note a failed sample; one that means Loops lost the run makes `lost` stop the run."""
        if self.lost is None and run_is_gone(exc):
            self.lost = exc

    @property
    def sampling_client(self) -> SamplingClient:
        if self._sampling_client is None:
            raise RuntimeError("the policy has not been published yet")
        return self._sampling_client

    async def publish(self) -> float:
        """Hand the trainer's weights to the sampler as the next policy version; returns seconds taken."""
        started = time.perf_counter()
        step = self.trainer_steps
        client = await self.training_client.save_weights_and_get_sampling_client_async(f"step-{step:06d}")
        self._sampling_client, self.version = client, step
        if step == 0 and self._reference is None:
            self._reference = client  # the fresh LoRA (B = 0) is the base model: the reference policy
        return time.perf_counter() - started

    async def reference_logprobs(self, datums: Sequence[SequenceDatum]) -> list[list[float]]:
        """The base model's logprob of every target token of each datum (aligned with `target_tokens`), scored
        by the version-0 policy (the fresh LoRA is the base model)."""
        import asyncio

        client = self._reference
        if client is None:
            raise RuntimeError(
                "the reference policy (version 0) is not available: it is the first policy a run publishes, "
                "so a run resumed past step 0 cannot use a loss that needs ref_logprobs"
            )

        async def score(d: SequenceDatum) -> list[float]:
            lps = await client.compute_logprobs_async(d.model_input())
            # compute_logprobs is aligned with the input (entry 0 is None); targets are tokens[1:].
            return [0.0 if lp is None else float(lp) for lp in lps[1 : len(d.tokens)]]

        return list(await asyncio.gather(*(score(d) for d in datums)))

    async def train_step(
        self,
        datums: Sequence[SequenceDatum],
        *,
        loss: TrainingLoss,
        adam: AdamParams,
    ) -> dict[str, float]:
        """forward_backward over every datum (in token-bounded requests), then one optim_step.

        A custom loss sees the whole step in one `forward_backward_custom` call (the SDK splits the wire
        requests itself), so it can normalise over the step as the built-in losses do.
        """
        tc = self.training_client
        custom_loss = loss.custom
        metrics: dict[str, float] = {}
        losses: list[tuple[float, int]] = []
        sampler_lp: list[float] = []
        trainer_lp: list[float] = []
        batches = (
            [list(datums)] if custom_loss is not None else token_batches(datums, FORWARD_BACKWARD_TOKENS)
        )
        for batch in batches:
            wire = [d.to_datum() for d in batch]
            if custom_loss is not None:
                if loss.needs_reference:
                    refs = await self.reference_logprobs(batch)
                    wire = [with_input(w, "ref_logprobs", r) for w, r in zip(wire, refs, strict=True)]
                # The SDK's custom path accepts only target_tokens (and weights) on the wire; the loss
                # reads the full datums through for_batch.
                bare = [bare_datum(w) for w in wire]
                fut = await tc.forward_backward_custom_async(bare, custom_loss.for_batch(wire))
            else:
                fut = await tc.forward_backward_async(
                    wire, loss_fn=loss.name, loss_fn_config=loss.config or None
                )
            out = await fut.result_async()
            out_metrics = getattr(out, "metrics", None) or {}
            custom = {k: float(v) for k, v in out_metrics.items() if k.startswith("custom/")}
            metrics.update(custom)
            # The embedded Loops reports these.
            for key in ("trainer/computed_tokens", "trainer/total_tokens"):
                if key in out_metrics:
                    metrics[key] = metrics.get(key, 0.0) + float(out_metrics[key])
            losses.append((custom.get("custom/loss", float(out.loss)), len(batch)))
            for d, lf in zip(batch, out.loss_fn_outputs, strict=True):
                lp = lf["logprobs"].data if hasattr(lf["logprobs"], "data") else lf["logprobs"]
                for q, p, s in zip(d.logprobs[1:], lp, d.sampled[1:], strict=True):
                    if s and p is not None and math.isfinite(p) and d.advantage != 0.0:
                        sampler_lp.append(q)
                        trainer_lp.append(p)
        step_fut = await tc.optim_step_async(adam)
        step_out = await step_fut.result_async()
        self.trainer_steps += 1
        total = sum(n for _, n in losses)
        metrics["loss"] = sum(v * n for v, n in losses) / total if total else 0.0
        for key, value in (getattr(step_out, "metrics", None) or {}).items():
            if isinstance(value, int | float):
                metrics[f"optim/{key}"] = float(value)
        metrics.update(sample_train_divergence(sampler_lp, trainer_lp))
        return metrics

    async def load_state_with_optimizer(self, path: str) -> None:
        fut = await self.training_client.load_state_with_optimizer_async(path)
        self.trainer_steps = int((await fut.result_async()).step)


def with_input(datum: Datum, name: str, values: list[float]) -> Datum:
    """`datum` with one more float `loss_fn_inputs` entry (shaped like its targets)."""
    from baseten.loops import TensorData

    inputs = {**datum.loss_fn_inputs, name: TensorData(data=values, dtype="float32", shape=[len(values)])}
    return datum.model_copy(update={"loss_fn_inputs": inputs})


def sample_train_divergence(sampler: Sequence[float], trainer: Sequence[float]) -> dict[str, float]:
    """How far the sampler's logprobs are from the trainer's on the trained tokens.

    kl_v1 = mean(q - p) and kl_v2 = mean((q - p)^2) / 2 estimate KL(sampler || trainer) as Tinker does;
    entropy is the sampler's mean negative logprob of what it sampled.
    """
    if not sampler:
        return {"kl/sample_train_v1": 0.0, "kl/sample_train_v2": 0.0, "entropy": 0.0}
    diffs = [q - p for q, p in zip(sampler, trainer, strict=True)]
    n = len(diffs)
    return {
        "kl/sample_train_v1": sum(diffs) / n,
        "kl/sample_train_v2": sum(d * d for d in diffs) / (2 * n),
        "entropy": -sum(sampler) / n,
    }
