"""The verifiers runtime end to end: the kit builds the verifiers 0.4 environment (uv, cached in the shared test
cache), and the loops-hidden-game environment (patterns/verifiers/hidden_game/env) runs out of process with
its model calls through the gateway: a plain reply, a tool call answered by the environment's tool (on SmolLM2 and
on the five other families' renderers, each writing its own tool-call syntax, then one training step each),
`loops check`, and a training step on the tiny model.

Skipped, with the reason, where the environment cannot be built (no PyPI and nothing in uv's cache).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from baseten.loops import AdamParams
from family_models import build_family_model
from family_replies import FAMILY_REPLIES
from helpers import read_jsonl, run_cli_in_process
from rl_config import tiny_run_toml
from scripted_policy import ScriptedPolicy

import loops_nb
from loops_nb.errors import UserError
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer import ChatRenderer, Renderer
from loops_nb.llm.renderer_choice import renderer_config
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.rl.attempt_boundary import checked_evidence
from loops_nb.rl.datums import sequence_datums
from loops_nb.runtime import Attempt, AttemptServices, Evidence
from loops_nb.verifiers import VerifiersRuntime, create_runtime

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME_ENV = REPO / "patterns" / "verifiers" / "hidden_game" / "env"
ENV_ID = "loops-hidden-game"


def cache_dir() -> Path:
    """Beside the shared model cache (tests/conftest.py), so the environment is built once per machine."""
    return Path(os.environ.get("LOOPS_NB_CACHE") or REPO / ".loops_cache") / "verifiers"


def options(**env_args: Any) -> dict[str, Any]:
    return {
        "env_id": ENV_ID,
        "env_args": env_args,
        "packages": [str(HIDDEN_GAME_ENV)],
        "cache_dir": str(cache_dir()),
        "episode_timeout_seconds": 300.0,
    }


@pytest.fixture(scope="module")
async def built() -> None:
    """The verifiers environment, built once (and then found in the shared cache)."""
    try:
        await create_runtime(**options()).environment()
    except UserError as exc:
        pytest.skip(f"cannot build the verifiers environment here: {exc}")


async def episode(runtime: VerifiersRuntime, gateway: ModelGateway, llm: Any) -> tuple[Evidence, Evidence]:
    task = (await runtime.tasks())[0]
    evidence = await LeasedRuntime(runtime, gateway).run_attempt(
        Attempt(task, 0, 0, 1, 0, AttemptServices(llm, llm.capture))
    )
    return evidence, checked_evidence(evidence, made_model_calls=bool(llm.capture.calls))


async def test_a_reply_is_scored_by_the_environments_rubric(
    built: None, gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = create_runtime(**options())
    listing = await runtime.listing()
    assert listing.verifiers_version.startswith("0.4.")
    assert listing.rubric.functions == ["names_game", "short_answer"]
    right, wrong = scripted("Monopoly"), scripted("Chess")
    _, scored = await episode(runtime, gateway, right)
    assert scored.discarded is None, scored.detail
    assert scored.reward == 1.0
    assert scored.metrics["verifiers/names_game"] == 1.0
    assert len(right.capture.calls) == 1
    _, zero = await episode(runtime, gateway, wrong)
    assert zero.discarded is None and zero.reward == 0.0, zero.detail


async def test_a_tool_call_goes_through_the_gateway_and_the_turns_stay_one_sequence(
    built: None, gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = create_runtime(**options(tool=True))
    llm = scripted('<tool_call>\n{"name": "lookup_game", "arguments": {}}\n</tool_call>', "Monopoly")
    evidence, scored = await episode(runtime, gateway, llm)
    assert scored.discarded is None, scored.detail
    assert scored.reward == 1.0
    calls = llm.capture.calls
    assert len(calls) == 2
    assert calls[0].tool_calls and calls[0].tool_calls[0]["function"]["name"] == "lookup_game"
    assert any(m.get("role") == "tool" and "Monopoly" in str(m.get("content")) for m in calls[1].messages)
    assert not llm.capture.breaks, "the second call's prompt extends the first call's prompt and reply"
    assert any(m.get("role") == "tool" for m in evidence.transcript)


LOOKUP_REPLIES = {
    "smollm2": ('<tool_call>\n{"name": "lookup_game", "arguments": {}}\n</tool_call>', "Monopoly"),
    "qwen3": (
        '<think>\nI look the game up.\n</think>\n\n<tool_call>\n{"name": "lookup_game", "arguments": {}}\n'
        "</tool_call><|im_end|>",
        "<think>\nThe tool answered.\n</think>\n\nMonopoly<|im_end|>",
    ),
    "qwen3.6": (
        "I look the game up.\n</think>\n\n<tool_call>\n<function=lookup_game>\n</function>\n</tool_call><|im_end|>",
        "The tool answered.\n</think>\n\nMonopoly<|im_end|>",
    ),
    "llama-3": ('{"name": "lookup_game", "parameters": {}}<|eot_id|>', "Monopoly<|eot_id|>"),
    "deepseek-v4": (
        'I look the game up.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="lookup_game">\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
        "The tool answered.</think>Monopoly<｜end▁of▁sentence｜>",
    ),
    "gpt-oss": (
        "I look the game up.<|end|><|start|>assistant to=functions.lookup_game<|channel|>commentary json"
        "<|message|>{}<|call|>",
        "The tool answered.<|end|><|start|>assistant<|channel|>final<|message|>Monopoly<|return|>",
    ),
}
"""Each family's two replies to the tool variant, in its own syntax (tests/family_replies.py has the
get_weather ones): the call to lookup_game (no arguments), then the answer, each from where the family's
generation prompt leaves off (SmolLM2's stop token is appended by the scripted sampler)."""


@pytest.fixture(scope="module")
async def tool_runtime(built: None) -> AsyncIterator[VerifiersRuntime]:
    """The tool variant in one verifiers process for every family's episode (verifiers imported once)."""
    runtime = create_runtime(**options(tool=True), episodes="shared")
    yield runtime
    await runtime.close()


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("family", list(LOOKUP_REPLIES))
async def test_every_familys_tool_episode_is_one_exact_sequence_that_trains(
    tool_runtime: VerifiersRuntime,
    gateway: ModelGateway,
    family_tokenizer: Callable[[str], Any],
    smollm2_path: Path,
    embedded_loops: Any,
    tmp_path: Path,
    family: str,
) -> None:
    """One episode of the tool variant on each family's renderer: the family's own call text is parsed into
    a lookup_game call, the environment answers it, the answer scores 1, and the second call's prompt
    continues the first call's tokens exactly (0 breaks: the attempt is one sequence, reasoning included),
    which then takes one training step on a tiny random model of the family (tests/family_models.py)."""
    call_reply, answer_reply = LOOKUP_REPLIES[family]
    renderer: Renderer
    if family == "smollm2":  # the kit's default: its own chat template, the stop token kept by the sampler
        from transformers import AutoTokenizer

        renderer = ChatRenderer(AutoTokenizer.from_pretrained(smollm2_path))
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        policy = ScriptedPolicy(renderer, [call_reply, answer_reply], logprob=-0.5, end_token=end)
    else:
        config = renderer_config(family, FAMILY_REPLIES[family].options)
        renderer = PrimeRenderer(family_tokenizer(family), family, config=config)
        policy = ScriptedPolicy(renderer, [call_reply, answer_reply], logprob=-0.5)
    llm = LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64))
    _, scored = await episode(tool_runtime, gateway, llm)
    assert scored.discarded is None, scored.detail
    assert scored.reward == 1.0, scored.detail
    calls = llm.capture.calls
    assert len(calls) == 2
    assert calls[0].tool_calls and calls[0].tool_calls[0]["function"]["name"] == "lookup_game"
    assert any(m.get("role") == "tool" and "Monopoly" in str(m.get("content")) for m in calls[1].messages)
    assert not llm.capture.breaks, llm.capture.breaks
    [sequence] = llm.capture.sequences()
    assert sequence.calls == 2
    # One training step on the sequence: SmolLM2 itself, else a tiny random model of the family.
    path = smollm2_path if family == "smollm2" else build_family_model(family, tmp_path / family)
    trainer = await embedded_loops.service_client().create_lora_training_client_async(
        base_model=str(path), rank=8, seed=0
    )
    [datum] = sequence_datums([sequence], 1.0, family)
    assert datum.trained_tokens == sum(len(c.completion_tokens) for c in calls), "both replies, nothing else"
    future = await trainer.forward_backward_async([datum.to_datum()], "importance_sampling")
    out = await future.result_async()
    assert out.loss == out.loss and len(out.loss_fn_outputs) == 1
    step = await trainer.optim_step_async(AdamParams(learning_rate=1e-3))
    assert await step.result_async() is not None


async def test_shared_episodes_in_one_verifiers_process(
    built: None, gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = create_runtime(**options(), episodes="shared")
    try:
        right, wrong = scripted("Monopoly"), scripted("Chess")
        (_, scored), (_, zero) = await asyncio.gather(
            episode(runtime, gateway, right), episode(runtime, gateway, wrong)
        )
    finally:
        await runtime.close()
    assert scored.reward == 1.0 and zero.reward == 0.0, (scored.detail, zero.detail)
    assert len(right.capture.calls) == len(wrong.capture.calls) == 1


def test_check_prints_the_environment_and_plays_one_episode(
    built: None, tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    path = tmp_path / "train.toml"
    path.write_text(
        tiny_run_toml(
            "loops_nb.verifiers:create_runtime", tiny_chat_model_path, tmp_path / "runs", options=options()
        )
    )
    result = run_cli_in_process("check", path)
    assert result.returncode == 0, result.stdout
    assert "verifiers 0.4.0, environment loops-hidden-game: 1 task(s)" in result.stdout
    assert "rubric HiddenGameTask: names_game x1" in result.stdout
    assert "first call through the gateway: task hidden-monopoly-0, 1 message(s), 0 tool(s)" in result.stdout
    assert "the rubric scored it 0" in result.stdout


async def test_one_training_step_on_the_tiny_model(
    built: None, tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    path = tmp_path / "train.toml"
    path.write_text(
        tiny_run_toml(
            "loops_nb.verifiers:create_runtime",
            tiny_chat_model_path,
            tmp_path / "runs",
            options=options(),
            training={"group_size": 2},
            sampling={"max_tokens": 8},
            output={"run_name": "vf"},
        )
    )
    outcome = await loops_nb.load(path).train()
    records = read_jsonl(Path(outcome.run_dir) / "rollouts.jsonl")
    assert len(records) == 2
    assert all(r["discarded"] is None for r in records), [r["detail"] for r in records]
    assert all(r["reward"] in (0.0, 1.0) for r in records)
    assert all(r["sampled_tokens"] > 0 for r in records)
