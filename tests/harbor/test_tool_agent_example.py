"""examples/tool_agent: the hidden checks grade what a ShellAgent leaves in the sandbox, and the example trains.

The fast tests drive the real `HarborRuntime` (local bubblewrap sandboxes, the tasks' own Dockerfiles and
hidden `tests/test.sh`) with a ShellAgent whose model is scripted: for every task, doing nothing scores 0,
a half-right sandbox 0.5 and the right one 1, and the agent cannot see the check while it works. The slow
test trains `train_local.toml` (SmolLM2 on the embedded local Loops) for one step with tiny sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl

import loops_nb
from loops_nb.harbor.harbor_runtime import HarborRuntime
from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.llm.client import Reply
from loops_nb.providers.provider_tables import LocalProviderConfig
from loops_nb.runtime import Attempt, AttemptServices, RunContext

pytestmark = pytest.mark.bwrap

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tool_agent"


def shell(command: str) -> Reply:
    return tool_call("shell", {"command": command})


def write_file(path: str, content: str) -> Reply:
    return tool_call("write_file", {"path": path, "content": content})


def tool_call(name: str, arguments: dict[str, Any]) -> Reply:
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return Reply("", [call], "", "stop", 8)


DONE = Reply("Done.", [], "Done.", "stop", 2)


class ScriptedLLM:
    """`LoopsLLM.chat` with scripted replies; records a model call per reply, as the real one does."""

    def __init__(self, capture: TokenCapture, replies: list[Reply]) -> None:
        self.capture, self.replies = capture, list(replies)

    async def chat(self, messages: list[dict[str, Any]], **_: Any) -> Reply:
        reply = self.replies.pop(0)
        self.capture.record(ModelCall([1, 2], [3], [-0.1], policy_version=0, finish_reason="stop"))
        return reply


# For each task: (replies, expected reward). The replies are what a policy might write.
SCRIPTS: dict[str, list[tuple[list[Reply], float]]] = {
    "write_greeting": [
        ([DONE], 0.0),
        ([write_file("/app/greeting.txt", "Hello, Loops\n"), DONE], 0.5),
        ([write_file("greeting.txt", "hello, loops!"), DONE], 0.5),
        ([shell("echo 'Hello, Loops!' > greeting.txt"), DONE], 1.0),
        ([write_file("/app/greeting.txt", "Hello, Loops!"), DONE], 1.0),
    ],
    "count_lines": [
        ([shell("wc -l inventory.txt"), DONE], 0.0),
        ([shell("wc -l inventory.txt > answer.txt"), DONE], 0.5),
        ([shell("wc -c < inventory.txt > /app/answer.txt"), DONE], 0.5),
        ([shell("wc -l < /app/inventory.txt > /app/answer.txt"), DONE], 1.0),
        ([write_file("/app/answer.txt", "23\n"), DONE], 1.0),
    ],
    "fix_script": [
        ([shell("bash greet.sh Ada"), DONE], 0.0),
        ([shell("rm greet.sh"), DONE], 0.0),
        ([write_file("/app/greet.sh", 'echo "Hello, Ada!"\n'), DONE], 0.5),
        ([write_file("/app/greet.sh", '#!/bin/bash\necho "Hello, $1!"\n'), DONE], 1.0),
        ([shell("sed -i 's/\\$name!$/$name!\"/' greet.sh && bash greet.sh Ada"), DONE], 1.0),
    ],
}


@pytest.fixture
def runtime(tmp_path: Path) -> HarborRuntime:
    runtime = HarborRuntime(
        tasks="tasks",
        agent="loops_nb.harbor.shell_agent:ShellAgent",
        agent_kwargs={"max_turns": 4, "command_timeout": 10},
        provider="local",
        keep_trials="none",
    )
    (tmp_path / "state").mkdir()
    local = LocalProviderConfig(type="local", network="none", scratch_dir=str(tmp_path / "scratch"))
    runtime.bind(RunContext(config_dir=EXAMPLE, state_dir=tmp_path / "state", providers={"local": local}))
    return runtime


async def attempt_with(runtime: HarborRuntime, task_id: str, replies: list[Reply], index: int = 0) -> Any:
    task = next(t for t in await runtime.tasks() if t.id == task_id)
    capture = TokenCapture()
    services = AttemptServices(llm=ScriptedLLM(capture, replies), capture=capture)  # type: ignore[arg-type]
    attempt = Attempt(task=task, group=0, index=index, seed=0, policy_version=0, services=services)
    return await runtime.run_attempt(attempt)


async def test_the_example_has_the_three_tasks(runtime: HarborRuntime) -> None:
    assert sorted(t.id for t in await runtime.tasks()) == sorted(SCRIPTS)


@pytest.mark.parametrize("task_id", sorted(SCRIPTS))
async def test_the_hidden_check_gives_partial_credit(
    runtime: HarborRuntime, task_id: str, tmp_path: Path
) -> None:
    rewards = []
    for index, (replies, _) in enumerate(SCRIPTS[task_id]):
        evidence = await attempt_with(runtime, task_id, replies, index)
        assert evidence.discarded is None, evidence.detail
        rewards.append(evidence.reward)
        roles = [m["role"] for m in evidence.transcript]
        assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "verifier", roles
    assert rewards == [expected for _, expected in SCRIPTS[task_id]]
    events = read_jsonl(tmp_path / "state" / "journal.jsonl")
    created = sorted(e["key"] for e in events if e["event"] == "created")
    assert len(created) == len(SCRIPTS[task_id])
    assert created == sorted(e["key"] for e in events if e["event"] == "released")
    assert not list((tmp_path / "scratch" / "loops_nb_sandboxes").iterdir()), (
        "sandbox directories are removed"
    )


async def test_the_agent_sees_the_task_files_but_not_the_check(runtime: HarborRuntime) -> None:
    look = [shell("ls -a /app /tests /solution; cat /app/greet.sh"), DONE]
    evidence = await attempt_with(runtime, "fix_script", look)
    listing = next(m["content"] for m in evidence.transcript if m["role"] == "tool")
    assert "greet.sh" in listing and 'echo "Hello, $name!' in listing, "the Dockerfile COPY put the script in"
    assert "test.sh" not in listing and "solve.sh" not in listing, listing
    assert evidence.reward == 0.0


@pytest.mark.slow
async def test_train_local_runs_end_to_end(tmp_path: Path) -> None:
    """train_local.toml for one step on SmolLM2 with tiny sizes: it completes, and nothing leaks."""
    scratch = tmp_path / "scratch"
    overrides = {
        "training.max_steps": 1,
        "training.group_size": 2,
        "training.groups_per_step": 3,
        "training.save_every": 0,
        "sampling.max_tokens": 48,
        "runtime.options.agent_kwargs": {"max_turns": 2, "command_timeout": 10, "max_output_chars": 400},
        "providers.local.scratch_dir": str(scratch),
        "output.output_dir": str(tmp_path / "runs"),
        "output.run_name": "e2e",
    }
    project = loops_nb.load(EXAMPLE / "train_local.toml", overrides=overrides)
    report = await project.check()
    assert report.ok, report.problems
    outcome = await project.train()
    run = Path(outcome.run_dir)
    assert outcome.status == "completed"

    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == [0]
    records = read_jsonl(run / "rollouts.jsonl")
    assert len(records) == 6 and {r["task"] for r in records} == set(SCRIPTS)
    graded = [r for r in records if r["discarded"] is None]
    assert graded, [r["detail"] for r in records]
    assert all(r["sampled_tokens"] > 0 and r["policy_versions"] == [0] for r in graded)
    assert all(0.0 <= r["reward"] <= 1.0 for r in graded)

    attempts = json.loads((run / "transcripts" / "step-000000.json").read_text())
    for attempt in (a for a in attempts if a["discarded"] is None):
        assert 1 <= len(attempt["calls"]) <= 2, "one model call per turn, at most max_turns"
        assert all(
            c["completion_tokens"] and len(c["logprobs"]) == len(c["completion_tokens"])
            for c in attempt["calls"]
        )
        assert "<tools>" in attempt["calls"][0]["prompt"], "the chatml-tools template lists the tools"
        roles = [m["role"] for m in attempt["transcript"]]
        assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "verifier"

    events = read_jsonl(run / "state" / "journal.jsonl")
    created = sorted(e["key"] for e in events if e["event"] == "created")
    assert len(created) == 6
    assert created == sorted(e["key"] for e in events if e["event"] == "released"), "every sandbox released"
    assert not list((scratch / "loops_nb_sandboxes").iterdir())


@pytest.mark.parametrize("task_id", sorted(SCRIPTS))
async def test_harbors_oracle_scores_1_with_the_reference_solution(task_id: str, tmp_path: Path) -> None:
    """Harbor's own `oracle` agent runs `solution/solve.sh` in the local sandbox: the check gives it 1."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    config = TrialConfig(
        task=TaskConfig(path=EXAMPLE / "tasks" / task_id),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name="oracle"),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"scratch_dir": str(tmp_path / "scratch"), "network": "none"},
        ),
    )
    result = await (await Trial.create(config)).run()
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None and result.verifier_result.rewards == {"reward": 1}
