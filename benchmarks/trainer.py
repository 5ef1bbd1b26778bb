"""Trainer path: forward_backward + optim_step through the SDK and the embedded Loops, against the
same math in a plain torch/PEFT loop on the same batch and model.

Run: `uv run python -m benchmarks trainer`.

The embedded Loops runs at its default dtype (`auto`: bf16 on CUDA, float32 on a CPU; bf16 on a CPU was
measured and is not the default there, see docs/benchmarks.md). It is compared with a plain PEFT loop in
float32 (the issue's aim: >= 1.3x its tokens/s) and with the same plain loop at the embedded Loops' dtype
(what the SDK path costs: >= 0.9). A third side runs the embedded Loops with a trainer budget that holds
the whole batch, so what the default memory budget costs (every decoder layer recomputed in the
backward) reads beside it. On a CPU with AMX or AVX512-BF16 a fourth runs it at `dtype = "bf16-mixed"`.
The step functions are built first and then run alternately, so load from other processes falls on all
alike. The plain loops build and run on the embedded Loops' compute lane, so
every side computes on one thread, as a run does (`benchmarks.common.on_compute_lane`).
The rows: wall-clock tokens/s, and the process's CPU seconds per step (all threads: torch's, the
embedded server's and the SDK's), which shows how much work the SDK path adds whatever else the machine
is doing.

Deliberate simplifications: one fixed batch (8 sequences x 128 tokens, every target trained), a few
steps after a warm-up, the median step time.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.common import MODEL, Result, model_path, on_compute_lane

BATCH, LENGTH, STEPS = 8, 128, 6
ROOMY_BUDGET_MB = 2048
"""A trainer budget that holds this benchmark's whole batch with every layer's intermediates (about 1.3 GB
in float32 on SmolLM2-135M), to show what the default budget (a quarter of the weights) costs in speed."""
Step = Callable[[], None]


def batch(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab - 1, (BATCH, LENGTH + 1), generator=g).tolist()


def default_dtype() -> torch.dtype:
    """The dtype the embedded Loops picks for the base weights here (`[compute.local] dtype = "auto"`)."""
    from loops_nb.local.model_store import device_and_dtype

    return device_and_dtype("auto", "auto")[1]


def mixed_side() -> bool:
    """Whether to add a `dtype = "bf16-mixed"` side: on a CPU that multiplies bf16 in hardware, where it is
    the opt-in that is faster than float32 (on CUDA, `auto` is bf16 already)."""
    from loops_nb.local.model_store import cpu_has_fast_bf16

    return not torch.cuda.is_available() and cpu_has_fast_bf16()


def short(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def plain_peft(path, rows: list[list[int]], dtype: torch.dtype = torch.float32) -> Step:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    model.eval()  # as the local trainer: no dropout, so trainer and sampler logprobs agree
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    ids = torch.tensor(rows)

    def step() -> None:
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        (loss / ids[:, 1:].numel()).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()

    return step


@contextlib.contextmanager
def through_sdk(
    rows: list[list[int]], memory_budget_mb: int | None = None, dtype: str = "auto"
) -> Iterator[Step]:
    from baseten.loops import AdamParams, Datum, ModelInput, TensorData

    from loops_nb.local.embedded import EmbeddedLoops

    device = "cpu" if not torch.cuda.is_available() else "auto"
    with EmbeddedLoops(device=device, dtype=dtype, memory_budget_mb=memory_budget_mb) as loops:
        tc = loops.service_client().create_lora_training_client(base_model=MODEL, rank=16)
        data = [
            Datum(
                model_input=ModelInput.from_ints(r[:-1]),
                loss_fn_inputs={"target_tokens": TensorData(data=r[1:], dtype="int64", shape=[LENGTH])},
            )
            for r in rows
        ]

        def step() -> None:
            fb = tc.forward_backward(data, loss_fn="cross_entropy")
            tc.optim_step(AdamParams(learning_rate=1e-4)).result()
            fb.result()

        try:
            yield step
        finally:
            tc.close()


def alternate(steps: dict[str, Step], rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall seconds, process CPU seconds) per step of each, run in turn after one warm-up each."""
    for step in steps.values():
        step()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            w, c = time.perf_counter(), time.process_time()
            step()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in steps}


def run() -> list[Result]:
    path = model_path()
    from transformers import AutoConfig

    rows = batch(AutoConfig.from_pretrained(path).vocab_size)
    tokens = BATCH * LENGTH
    dtype = default_dtype()
    steps = {"fp32": on_compute_lane(lambda: plain_peft(path, rows, torch.float32))}
    if dtype != torch.float32:
        steps["same"] = on_compute_lane(lambda: plain_peft(path, rows, dtype))
    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(through_sdk(rows))
        roomy = stack.enter_context(through_sdk(rows, memory_budget_mb=ROOMY_BUDGET_MB))
        if mixed_side():
            steps["mixed"] = stack.enter_context(through_sdk(rows, dtype="bf16-mixed"))
        times = alternate({"ours": ours, "roomy": roomy, **steps}, STEPS)
    wall, cpu = times["ours"]
    ours_name = f"trainer fb+optim tokens/s, embedded Loops ({short(dtype)}, auto)"
    results = [
        Result(
            f"{ours_name} vs plain PEFT fp32", tokens / wall, tokens / times["fp32"][0], "tok/s", ">= 1.3"
        ),
        Result(
            f"the same at memory_budget_mb = {ROOMY_BUDGET_MB} (the whole batch kept, nothing recomputed) vs "
            "plain PEFT fp32",
            tokens / times["roomy"][0],
            tokens / times["fp32"][0],
            "tok/s",
            "informational: what the default budget costs",
        ),
    ]
    if "mixed" in times:
        results.append(
            Result(
                'the same at dtype = "bf16-mixed" (bf16 linear products, float32 elsewhere) vs plain PEFT fp32',
                tokens / times["mixed"][0],
                tokens / times["fp32"][0],
                "tok/s",
                ">= 1.3",
            )
        )
    same = times.get("same", times["fp32"])
    if dtype != torch.float32:
        results.append(
            Result(
                f"{ours_name} vs plain PEFT {short(dtype)}",
                tokens / wall,
                tokens / same[0],
                "tok/s",
                ">= 0.9",
            )
        )
    results.append(
        Result(
            f"trainer CPU seconds per step (all threads), embedded Loops vs plain PEFT {short(dtype)}",
            cpu,
            same[1],
            "s",
            "informational",
            higher_is_better=False,
        )
    )
    return results
