"""How long one model call takes on the embedded Loops on this machine: an estimate for `loops check`.

Agents' timeouts are written for GPUs, so `loops check` compares a task's agent timeout with this estimate
(docs/reference/harbor.md). It times the model's largest linear layer on one thread, at the sampler's batch
sizes, and scales it to every linear weight and to torch's threads; attention, the sampler's overheads and
imperfect thread scaling are left out, so it errs short (SmolLM2, eight Terminus-2 attempts: 22 s
estimated, 33 s measured). A call decodes all `max_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from loops_nb.local.memory_budget import ModelShape

PREFILL_ROWS = 256
"""Rows per timed product while prefilling: a prompt's tokens go through the weights together."""


@dataclass(frozen=True)
class CallTime:
    """The estimated seconds of one model call (prefill and decode), and the call they are for."""

    seconds: float
    prompt_tokens: int
    new_tokens: int
    concurrent: int

    def describe(self) -> str:
        return (
            f"about {self.seconds:.0f} s ({self.prompt_tokens:,}-token prompt, {self.new_tokens} new tokens, "
            f"{self.concurrent} at once)"
        )


@dataclass(frozen=True)
class LocalCallSpeed:
    """This machine's speed for one model, measured once: per-token seconds of prefill and of a decode step
    when `concurrent` sequences share the sampler."""

    prefill_seconds_per_token: float
    decode_seconds_per_token: float
    concurrent: int

    @classmethod
    def measure(cls, model_dir: Path, *, concurrent: int) -> LocalCallSpeed:
        shape = ModelShape.read(model_dir)
        heads = [d for name in ("lm_head", "embed_tokens") for d in shape.linear_shapes.get(name, [])]
        head = max((out * inp for out, inp in heads), default=0)  # tied or not, one head product per token
        body = sum(
            out * inp
            for name, dims in shape.linear_shapes.items()
            if name not in ("lm_head", "embed_tokens")
            for out, inp in dims
        )
        out, inp = max(
            (d for name, dims in shape.linear_shapes.items() if name != "embed_tokens" for d in dims),
            key=lambda d: d[0] * d[1],
        )
        rows = max(1, concurrent)
        # Each decode step passes every concurrent sequence's next token through every weight and the head;
        # concurrent prompts are prefilled by the same cores, so one call waits for its share of all of them
        # (only a prompt's last position needs the head).
        return cls(
            prefill_seconds_per_token=rows * body / _products_per_second(out, inp, PREFILL_ROWS),
            decode_seconds_per_token=rows * (body + head) / _products_per_second(out, inp, rows),
            concurrent=rows,
        )

    def call(self, prompt_tokens: int, new_tokens: int) -> CallTime:
        seconds = prompt_tokens * self.prefill_seconds_per_token + new_tokens * self.decode_seconds_per_token
        return CallTime(seconds, prompt_tokens, new_tokens, self.concurrent)


def _products_per_second(out: int, inp: int, rows: int) -> float:
    """Multiply-adds per second of a float32 `linear` of (rows x inp) by an (out x inp) weight here, on all of
    torch's threads. Timed on one thread and scaled, because a multi-threaded product on a busy machine waits
    on its slowest thread and times the other processes, not this machine (the scaling errs short)."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    weight, x = torch.randn(out, inp), torch.randn(rows, inp)
    torch.set_num_threads(1)
    try:
        F.linear(x, weight)  # warm-up: the first product pays for allocation
        repeats = 1
        while True:  # enough repeats that one timing takes >= 50 ms and a scheduler hiccup does not decide it
            started = time.perf_counter()
            for _ in range(repeats):
                F.linear(x, weight)
            if time.perf_counter() - started >= 0.05:
                break
            repeats *= 4
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(repeats):
                F.linear(x, weight)
            best = min(best, (time.perf_counter() - started) / repeats)
    finally:
        torch.set_num_threads(threads)
    return threads * rows * inp * out / max(best, 1e-12)
