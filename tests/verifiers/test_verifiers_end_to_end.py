"""The verifiers runtime end to end: the kit builds the verifiers 0.4 environment (uv, cached in the shared test
cache), and the loops-hidden-game environment (patterns/verifiers/hidden_game/env) runs out of process with
its model calls through the gateway: a plain reply, a tool call answered by the environment's tool, `loops
check`, and a training step on the tiny model.

Skipped, with the reason, where the environment cannot be built (no PyPI and nothing in uv's cache).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl, run_cli_in_process
from rl_config import tiny_run_toml

import loops_nb
from loops_nb.errors import UserError
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.rl.attempt_boundary import checked_evidence
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
    assert listing.rubric.functions == ["names_game"]
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
