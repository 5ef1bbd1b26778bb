"""The Harbor runtime end to end on a tiny model: trials train, and every failure is a discard, not a crash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl, run_cli_in_process
from rl_config import rl_config_toml, tiny_run_toml

import loops_nb

pytestmark = pytest.mark.bwrap

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"

AGENTS = """
import asyncio

from loops_nb.harbor import LoopsAgent
from loops_nb.llm.client import llm


class Answer(LoopsAgent):
    async def run(self, instruction, environment, context):
        reply = await llm().chat([{"role": "user", "content": instruction}], max_tokens=4)
        self.transcript.append(reply.message)
        await self.write_file(environment, "/app/answer.txt", "Monopoly" if self.attempt.index % 2 else reply.content)


class Crash(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.llm.chat([{"role": "user", "content": instruction}], max_tokens=4)
        raise ValueError("the agent's own bug")


class Silent(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.write_file(environment, "/app/answer.txt", "Monopoly")


class Hang(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.llm.chat([{"role": "user", "content": instruction}], max_tokens=4)
        await asyncio.sleep(3600)


class NotAnAgent:
    pass
"""


def harbor_config_toml(tmp_path: Path, model: Path, agent: str, **options: Any) -> str:
    """One step of one group of four attempts of `harbor_agents:<agent>` on the hidden game, each in a local sandbox."""
    return tiny_run_toml(
        "loops_nb.harbor:create_runtime",
        model,
        tmp_path / "runs",
        options={
            "tasks": HIDDEN_GAME,
            "agent": f"harbor_agents:{agent}",
            "provider": "sandbox",
            "keep_trials": "failed",
            **options,
        },
        model={"max_seq_len": 256},
        providers={"sandbox": {"type": "local", "scratch_dir": tmp_path / "scratch"}},
        sampling={"max_tokens": 4},
        training={"save_every": 0},
        output={"run_name": agent, "trace": "full"},
    )


def make(tmp_path: Path, model: Path, agent: str) -> Path:
    (tmp_path / "harbor_agents.py").write_text(AGENTS)  # not `agents`: the OpenAI Agents SDK is `agents`
    config = tmp_path / f"{agent}.toml"
    config.write_text(harbor_config_toml(tmp_path, model, agent))
    return config


def rollouts(run: Path) -> list[dict]:
    return read_jsonl(run / "rollouts.jsonl")


def journal(run: Path) -> list[dict]:
    return read_jsonl(run / "state" / "journal.jsonl")


@pytest.mark.slow
async def test_trials_train_and_their_sandboxes_are_released(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    project = loops_nb.load(make(tmp_path, tiny_chat_model_path, "Answer"))
    outcome = await project.train()
    run = Path(outcome.run_dir)
    records = rollouts(run)
    assert len(records) == 4
    assert all(r["discarded"] is None and r["sampled_tokens"] > 0 for r in records)
    assert sorted(r["reward"] for r in records)[-2:] == [1.0, 1.0], "odd attempts write the hidden answer"
    events = journal(run)
    created = [e["key"] for e in events if e["event"] == "created"]
    released = [e["key"] for e in events if e["event"] == "released"]
    assert len(created) == 4 and sorted(created) == sorted(released)
    assert not list((tmp_path / "scratch" / "loops_nb_sandboxes").iterdir())
    assert not (run / "harbor_trials").exists() or not list((run / "harbor_trials").iterdir()), (
        "successful trial directories are not kept under keep_trials = failed"
    )
    transcript = json.loads(next((run / "transcripts").iterdir()).read_text())
    assert "verifier" in json.dumps(transcript), "the verifier's output is part of the attempt's transcript"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("agent", "reason", "detail"),
    [("Crash", "error", "the agent's own bug"), ("Silent", "no_model_calls", "")],
)
async def test_a_failing_agent_is_discarded_with_its_reason(
    tmp_path: Path, tiny_chat_model_path: Path, agent: str, reason: str, detail: str
) -> None:
    project = loops_nb.load(make(tmp_path, tiny_chat_model_path, agent))
    outcome = await project.train()
    records = rollouts(Path(outcome.run_dir))
    assert {r["discarded"] for r in records} == {reason}
    assert all(detail in r["detail"] for r in records)
    if reason == "error":
        assert all("trial directory:" in r["detail"] for r in records), (
            "a failed trial's directory is kept and named"
        )


@pytest.mark.slow
def test_a_run_whose_every_attempt_timed_out_fails_and_keeps_each_trial(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    config = make(tmp_path, tiny_chat_model_path, "Hang")
    config.write_text(config.read_text().replace("[training]\n", "[training]\nattempt_timeout_seconds = 8\n"))
    result = run_cli_in_process("run", config)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "status: failed (1 steps" in result.stdout
    assert (
        "reason: no step trained: all 4 attempts were discarded (4 timeout); the first timeout: no result "
        in (result.stdout)
    )
    run = tmp_path / "runs" / "Hang"
    records = rollouts(run)
    assert {r["discarded"] for r in records} == {"timeout"}
    kept = [
        line.split("trial directory: ", 1)[1].rstrip(")")
        for r in records
        for line in r["detail"].splitlines()
        if "trial directory: " in line
    ]
    assert len(kept) == 4 and all(Path(k).is_dir() for k in kept), (
        "a timed-out trial's folder is kept and named"
    )
    table = run_cli_in_process("runs", run)
    assert "failed" in table.stdout, table.stdout


async def test_check_refuses_an_agent_that_is_not_a_loops_agent(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    report = await loops_nb.load(make(tmp_path, tiny_chat_model_path, "NotAnAgent")).check()
    assert not report.ok
    assert any("is not a LoopsAgent subclass" in p for p in report.problems)


async def test_check_reports_a_task_directory_that_is_not_a_harbor_task(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    broken = tmp_path / "broken"
    (broken / "environment").mkdir(parents=True)
    (broken / "task.toml").write_text("[task]\nname = 'x/y'\n")
    config = make(tmp_path, tiny_chat_model_path, "Answer")
    config.write_text(config.read_text().replace(str(HIDDEN_GAME), str(broken)))
    report = await loops_nb.load(config).check()
    assert not report.ok
    assert any(f"Harbor task {broken}" in p and "instruction.md" in p for p in report.problems)


async def test_check_reports_tasks_the_local_sandbox_would_refuse(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    task = tmp_path / "tasks" / "needs_build"
    shutil.copytree(HIDDEN_GAME, task)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12\nRUN pip install numpy\n")
    config = make(tmp_path, tiny_chat_model_path, "Answer")
    config.write_text(config.read_text().replace(str(HIDDEN_GAME), str(tmp_path / "tasks")))
    report = await loops_nb.load(config).check()
    assert not report.ok
    assert any("needs_build" in p and "line 2: RUN pip install numpy" in p for p in report.problems)
    ignored = config.read_text().replace('type = "local"', 'type = "local"\nignore_dockerfile = true')
    config.write_text(ignored)
    assert (await loops_nb.load(config).check()).ok


def test_each_runtime_pins_its_own_agent_module_for_harbor(tmp_path: Path) -> None:
    from harbor.utils.import_path import import_symbol

    from loops_nb.episodes import load_runtime

    paths = []
    for mark in (1, 2):
        d = tmp_path / f"pattern{mark}"
        d.mkdir()
        (d / "agent.py").write_text(
            f"from loops_nb.harbor import LoopsAgent\nclass Agent(LoopsAgent):\n    MARK = {mark}\n"
        )
        (d / "train.toml").write_text(
            rl_config_toml(
                "loops_nb.harbor:create_runtime", options={"tasks": HIDDEN_GAME, "agent": "agent:Agent"}
            )
        )
        project = loops_nb.load(d / "train.toml")
        runtime = load_runtime(project.config.runtime.factory, project.config.runtime.options)
        paths.append(runtime.agent_import_path())
    # Harbor imports by path when each trial starts, long after both configs were loaded.
    assert [import_symbol(p).MARK for p in paths] == [1, 2]
