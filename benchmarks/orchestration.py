"""Orchestration overhead: the RL pipeline (rendering, capture, GRPO, datums, logging) against a
backend that answers instantly, as attempts/s and as a share of a real local step. Aim: < 5%.

The instant backend returns a fixed 16-token completion from `sample_async` and empty results from
`forward_backward_async` / `optim_step_async`, so all measured time is loops_nb's own. The real step
time comes from the quickstart's shape (64 attempts of 16 tokens) on the embedded Loops.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import Result

STEPS = 5
QUICKSTART = (
    Path(__file__).resolve().parents[1] / "patterns/custom_runtime/in_process_direct/train_local.toml"
)


class _Done:
    def __init__(self, value: object) -> None:
        self.value = value

    async def result_async(self) -> object:
        return self.value


class InstantTrainingClient:
    run_id = "instant"

    async def forward_backward_async(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        outputs = [{"logprobs": SimpleNamespace(data=list(d.loss_fn_inputs["logprobs"].data))} for d in data]
        return _Done(SimpleNamespace(loss=0.0, loss_fn_outputs=outputs))

    async def optim_step_async(self, params):
        return _Done(SimpleNamespace(metrics={}))

    async def save_weights_and_get_sampling_client_async(self, name):
        return InstantSampler()

    async def save_state_async(self, name):
        return _Done(SimpleNamespace(path=f"instant://{name}"))

    async def save_weights_for_sampler_async(self, name):
        return _Done(SimpleNamespace(path=f"instant://{name}"))


class InstantSampler:
    async def sample_async(self, model_input, num_samples, sampling_params):
        tokens = [1000 + i for i in range(16)]
        seq = SimpleNamespace(tokens=tokens, logprobs=[-1.0] * 16, stop_reason="length")
        return SimpleNamespace(sequences=[seq] * num_samples, policy_version=None)


async def instant_pipeline_seconds() -> tuple[float, int]:
    from loops_nb import load
    from loops_nb.episodes import load_runtime
    from loops_nb.llm.renderer import ChatRenderer
    from loops_nb.model_renderer import load_model_tokenizer
    from loops_nb.observers import ObserverSet
    from loops_nb.rl.loop import RLRun
    from loops_nb.rl.policy import Policy
    from loops_nb.run_dir import RunDirectory

    with tempfile.TemporaryDirectory() as tmp:
        project = load(
            QUICKSTART,
            overrides={"training.max_steps": STEPS, "output.output_dir": tmp, "training.save_every": 0},
        )
        config = project.config
        renderer = ChatRenderer(load_model_tokenizer(config.model, "local"))
        runtime = load_runtime(config.runtime.factory, config.runtime.options)
        run = RLRun(
            config,
            RunDirectory(Path(tmp) / "run"),
            Policy(InstantTrainingClient(), "instant"),
            runtime,
            renderer,
            ObserverSet([]),
        )
        started = time.perf_counter()
        await run.execute(0)
        seconds = time.perf_counter() - started
    attempts = STEPS * config.training.group_size * config.training.groups_per_step
    return seconds, attempts


def real_step_seconds() -> float:
    import json

    from loops_nb import load

    with tempfile.TemporaryDirectory() as tmp:
        project = load(
            QUICKSTART, overrides={"training.max_steps": 2, "output.output_dir": tmp, "output.run_name": "r"}
        )
        asyncio.run(project.train(observers=[]))
        steps = [json.loads(x) for x in (Path(tmp) / "r" / "steps.jsonl").read_text().splitlines()]
    return min(s["time/step_s"] for s in steps)


def run() -> list[Result]:
    asyncio.run(instant_pipeline_seconds())  # warm-up: imports, tokenizer load, template compilation
    seconds, attempts = asyncio.run(instant_pipeline_seconds())
    per_step_overhead = seconds / STEPS
    real = real_step_seconds()
    return [
        Result(
            "pipeline attempts/s (instant backend)",
            attempts / seconds,
            float("nan"),
            "att/s",
            "informational",
        ),
        Result(
            "overhead share of a local step",
            per_step_overhead,
            real,
            "s",
            "< 0.05 (ours/ref)",
            higher_is_better=True,
        ),
    ]
