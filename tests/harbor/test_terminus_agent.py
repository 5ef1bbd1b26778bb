"""Harbor's own Terminus-2 (tmux-driven) through the long-lived local sandbox and the run's model gateway.

Before the local sandbox kept one namespace per trial, Terminus-2's tmux server died with the command
that started it and the agent exited in seconds with no model call. Here its keystrokes reach a tmux
session that lives across commands, its completions come from the policy through an attempt's gateway
lease, and the verifier grades what it typed.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial
from helpers import read_jsonl
from scripted_policy import ScriptedPolicy

import loops_nb
from loops_nb.harbor.agent import forget_attempt, register_attempt
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.model_access import ModelGateway
from loops_nb.runtime import Attempt, AttemptServices, Task

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="Terminus-2 needs tmux (.ci/run installs it)"),
]

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"
PATTERN = REPO / "patterns" / "harbor" / "terminus_2" / "train_local.toml"

TYPE_THE_ANSWER = json.dumps(
    {
        "analysis": "The answer goes in /app/answer.txt.",
        "plan": "Write it with echo.",
        "commands": [{"keystrokes": "echo Monopoly > /app/answer.txt\n", "duration": 0.5}],
        "task_complete": True,
    }
)
CONFIRM = json.dumps({"analysis": "Written.", "plan": "Done.", "commands": [], "task_complete": True})


async def test_terminus_2_types_into_tmux_in_the_sandbox_with_completions_from_the_gateway(
    tmp_path: Path, tiny_chat_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_chat_model_path))
    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    policy = ScriptedPolicy(renderer, [TYPE_THE_ANSWER, CONFIRM, CONFIRM], logprob=-0.5, end_token=end)
    capture = TokenCapture()
    llm = LoopsLLM(renderer, policy, capture, SamplingDefaults(max_tokens=256))
    with ModelGateway(model_name="policy") as gateway:
        lease = gateway.issue("hidden-game/g0/a0", llm)
        services = AttemptServices(
            llm=llm, capture=capture, model_base_url=gateway.url, model_api_key=lease.key
        )
        attempt = Attempt(Task("hidden-game"), group=0, index=0, seed=0, policy_version=0, services=services)
        key = register_attempt(attempt)
        try:
            result: Any = await (await Trial.create(_trial(tmp_path, key))).run()
        finally:
            forget_attempt(key)
            gateway.revoke(lease.key)
    assert result.exception_info is None, result.exception_info
    assert len(capture.calls) >= 2, "Terminus-2 called the model, and again to confirm it was done"
    assert all(call.completion_tokens for call in capture.calls)
    assert "most famous board game" in renderer.tokenizer.decode(policy.prompts[0])
    assert result.verifier_result.rewards == {"reward": 1.0}, "its keystrokes ran in the tmux session"
    # Terminus-2 fills Harbor's context, so Harbor skips populate_context_post_run: the wrapper records the
    # transcript itself, with what was typed and what the pane showed.
    transcript = result.agent_result.metadata["loops_transcript"]
    assert transcript[0]["role"] == "user" and "most famous board game" in transcript[0]["content"]
    replies = [t for t in transcript if t["role"] == "assistant"]
    assert len(replies) == len(capture.calls)
    assert replies[0]["keystrokes"] == ["echo Monopoly > /app/answer.txt\n"]
    assert any(t["role"] == "terminal" and "echo Monopoly" in t["content"] for t in transcript)
    events = read_jsonl(tmp_path / "state" / "journal.jsonl")
    assert [e["event"] for e in events] == ["intent", "created", "released"]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("artificially limited" in w for w in warned), "max_turns is the config's choice, not news"


def _trial(tmp_path: Path, key: str) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=HIDDEN_GAME),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(
            import_path="loops_nb.harbor.terminus_agent:LoopsTerminus2",
            kwargs={"loops_attempt": key, "max_turns": 4, "enable_summarize": False},
        ),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={
                "loops_journal": str(tmp_path / "state" / "journal.jsonl"),
                "scratch_dir": str(tmp_path / "scratch"),
            },
        ),
    )


@pytest.fixture(scope="module")
def long_context_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model with room for Terminus-2's ~2,000-token first prompt."""
    from tiny_models import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-4k"), max_position_embeddings=4096)


@pytest.mark.slow
async def test_the_terminus_2_pattern_calls_the_model_in_a_one_step_run_and_its_tokens_train(
    tmp_path: Path, long_context_tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A random model's replies never end (every one hits max_tokens) and Terminus-2 re-asks on each until
    # the context is full: every attempt's LoopsLLM samples from a scripted policy instead, which answers
    # in Terminus-2's format, so the run's real gateway, sandbox, verifier and trainer run on its tokens.
    # The copy's verifier scores at random, so the group's rewards differ and GRPO trains them.
    task = tmp_path / "tasks" / "hidden_game"
    shutil.copytree(HIDDEN_GAME, task)
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncat /app/answer.txt\nmkdir -p /logs/verifier\necho 0.$RANDOM > /logs/verifier/reward.txt\n"
    )
    original_init = LoopsLLM.__init__

    def scripted(self: LoopsLLM, renderer: ChatRenderer, policy: Any, *args: Any, **kwargs: Any) -> None:
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        script = ScriptedPolicy(renderer, [TYPE_THE_ANSWER] * 8, logprob=-0.5, end_token=end)
        script.version = policy.version  # type: ignore[misc]
        original_init(self, renderer, script, *args, **kwargs)

    monkeypatch.setattr(LoopsLLM, "__init__", scripted)
    project = loops_nb.load(
        PATTERN,
        overrides={
            "model.base_model": str(long_context_tiny_model),
            "model.lora_rank": 4,
            "runtime.options.tasks": str(task),
            "training.max_steps": 1,
            "training.group_size": 2,
            "training.groups_per_step": 1,
            "output.output_dir": str(tmp_path / "runs"),
            "output.run_name": "terminus",
        },
    )
    outcome = await project.train()
    run = Path(outcome.run_dir)
    records = read_jsonl(run / "rollouts.jsonl")
    assert len(records) == 2
    assert all(r["discarded"] is None for r in records), [r["detail"] for r in records]
    assert all(r["sampled_tokens"] > 0 for r in records), "each trial's Terminus-2 called the model"
    assert all(r["trained"] for r in records)
    (step,) = read_jsonl(run / "steps.jsonl")
    assert step["tokens/trained"] > 0
