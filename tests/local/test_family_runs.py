"""Every family end to end on the local scope: a tiny random model of the family's architecture with its real
tokenizer (tests/family_models.py) takes one RL step on a two-turn tool episode and one SFT step, through the
embedded Loops and the family's renderer.

What runs is the family's own code: Qwen3.5/3.6's linear-attention cache, DeepSeek V4's compressed attention
and grouped output projection, gpt-oss's sliding windows and sinks, each family's MoE blocks, its tokens. These
runs found two bugs no SmolLM2 test could: the sampler could not select rows of a linear-attention cache (every
Qwen3.6 sample failed), and LoRA was put on DeepSeek V4's grouped projection (every step failed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from family_models import build_family_model
from family_replies import FAMILY_REPLIES, TOOLS
from scripted_policy import ScriptedPolicy

from loops_nb import load
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer_choice import renderer_config
from loops_nb.rl.datums import sequence_datums
from loops_nb.rl.policy import Policy

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FAMILIES = list(FAMILY_REPLIES)
QUESTION = [{"role": "user", "content": "What is the weather in Rome?"}]


@pytest.fixture(scope="module")
def family_model(
    tmp_path_factory: pytest.TempPathFactory, family_tokenizer: Callable[[str], Any]
) -> Callable[[str], Path]:
    """`family_model(name)`: the family's tiny model folder, built once per module (`family_tokenizer` also
    points Harmony at gpt-oss's vocabulary)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_family_model(name, tmp_path_factory.mktemp(name.replace(".", "_")))
        return built[name]

    return get


def renderer_for(name: str, path: Path) -> PrimeRenderer:
    """The family's renderer on the tokenizer saved with the model, as a run loads it from the folder."""
    from transformers import AutoTokenizer

    config = renderer_config(name, FAMILY_REPLIES[name].options)
    return PrimeRenderer(AutoTokenizer.from_pretrained(path), name, config=config)


@pytest.mark.parametrize("name", FAMILIES)
async def test_one_rl_step_on_a_two_turn_tool_episode(
    name: str, family_model: Callable[[str], Path], embedded_loops: Any
) -> None:
    from baseten.loops import AdamParams

    path = family_model(name)
    renderer = renderer_for(name, path)
    service = embedded_loops.service_client()
    trainer = await service.create_lora_training_client_async(base_model=str(path), rank=8, seed=0)
    policy = Policy(trainer, str(path))
    await policy.publish()

    # The family's sampler: one call through the renderer, on the family's architecture.
    sampled = LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=8), seed=0)
    await sampled.chat(QUESTION, tools=TOOLS)
    # The tool episode in the family's own syntax (a random model writes no call): the call, its result, the
    # answer. The second prompt continues the first call's exact tokens, so the attempt is one sequence.
    replies = FAMILY_REPLIES[name]
    scripted = LoopsLLM(
        renderer, ScriptedPolicy(renderer, [replies.call_reply, replies.answer_reply], logprob=-0.5)
    )
    messages: list[dict[str, Any]] = list(QUESTION)
    first = await scripted.chat(messages, tools=TOOLS)
    assert [c["function"]["name"] for c in first.tool_calls] == ["get_weather"]
    messages += [
        first.message,
        {"role": "tool", "tool_call_id": first.tool_calls[0]["id"], "content": "sunny"},
    ]
    second = await scripted.chat(messages, tools=TOOLS)
    assert second.content == "It is sunny in Rome."
    assert not scripted.capture.breaks, scripted.capture.breaks
    assert len(scripted.capture.sequences()) == 1

    datums = sequence_datums(sampled.capture.sequences(), 1.0, "sampled")
    # The episode twice, as a group's samples share a prompt: full-attention families run it once for both
    # rows (shared_prefix); the others decline sharing (their caches cannot repeat a prefix).
    datums += sequence_datums(scripted.capture.sequences(), -1.0, "scripted")
    datums += sequence_datums(scripted.capture.sequences(), 0.5, "scripted again")
    future = await trainer.forward_backward_async([d.to_datum() for d in datums], "importance_sampling")
    out = await future.result_async()
    assert out.loss == out.loss and len(out.loss_fn_outputs) == 3
    again = [out.loss_fn_outputs[k]["logprobs"].data for k in (1, 2)]
    assert max(abs(a - b) for a, b in zip(*again, strict=True)) < 1e-5, "the same tokens, the same logprobs"
    metrics = out.metrics or {}
    shared = metrics["trainer/computed_tokens"] < metrics["trainer/total_tokens"]
    assert shared is (name in ("qwen3", "llama-3")), metrics  # the full-attention families
    # The twin: the trainer's logprobs of the sampled tokens are the sampler's.
    seq = datums[0]
    trained = out.loss_fn_outputs[0]["logprobs"].data
    pairs = [(t, s) for t, s, m in zip(trained, seq.logprobs[1:], seq.sampled[1:], strict=True) if m]
    assert pairs and max(abs(t - s) for t, s in pairs) < 1e-3, pairs
    step = await trainer.optim_step_async(AdamParams(learning_rate=1e-3))
    assert await step.result_async() is not None
    policy.trainer_steps = 1
    await policy.publish()
    await sampled.chat(QUESTION, tools=TOOLS)  # the next policy samples too
    assert policy.version == 1


def sft_project(folder: Path, model: Path, name: str) -> Path:
    """An SFT config on the family's model: three tool conversations, one step."""
    replies = FAMILY_REPLIES[name]
    reasoning = {"reasoning_content": "I call the tool."} if replies.reasons else {}
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    row = {
        "tools": TOOLS,
        "messages": [
            *QUESTION,
            {"role": "assistant", "tool_calls": [call], **reasoning},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny in Rome.", **reasoning},
        ],
    }
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for _ in range(3)) + "\n")
    options = "".join(f"\nrenderer_options.{k} = {json.dumps(v)}" for k, v in replies.options.items())
    (folder / "sft.toml").write_text(
        f'recipe = "sft"\n[model]\nbase_model = "{model}"\nrenderer = "{name}"{options}\nlora_rank = 8\n'
        f'[compute]\nscope = "local"\n[compute.local]\ndevice = "cpu"\n'
        f'[data]\ntrain = "train.jsonl"\neval_fraction = 0\n'
        f"[training]\nmax_steps = 1\nbatch_tokens = 4096\nsave_every = 0\neval_every = 0\n"
        f'[output]\noutput_dir = "{folder / "runs"}"\nrun_name = "family"\n'
    )
    return folder / "sft.toml"


@pytest.mark.parametrize("name", FAMILIES)
async def test_one_sft_step_through_the_family_renderer(
    name: str, family_model: Callable[[str], Path], tmp_path: Path
) -> None:
    project = load(sft_project(tmp_path, family_model(name), name))
    report = await project.check()
    assert report.ok, report.problems
    text = "\n".join(report.lines)
    assert f"renderer: {name} (model.renderer = '{name}'); SFT trains what follows" in text
    assert report.data is not None and report.data.rows_refused == 0
    outcome = await project.train(observers=[])
    assert outcome.steps == 1
    steps = [
        json.loads(line) for line in (tmp_path / "runs" / "family" / "steps.jsonl").read_text().splitlines()
    ]
    assert steps and steps[0]["loss"] == steps[0]["loss"]
