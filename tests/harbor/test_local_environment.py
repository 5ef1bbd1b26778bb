"""Harbor trials in the local (bubblewrap) environment: real Harbor, no Docker, journalled sandboxes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial
from helpers import read_jsonl

from loops_nb.providers.local import read_dockerfile

pytestmark = pytest.mark.bwrap

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"


async def run_trial(task: Path, agent: str, tmp_path: Path, **env_kwargs) -> object:
    journal = tmp_path / "state" / "journal.jsonl"
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"loops_journal": str(journal), "scratch_dir": str(tmp_path / "scratch"), **env_kwargs},
        ),
    )
    return await (await Trial.create(config)).run()


async def test_the_oracle_solves_the_hidden_game_and_its_sandbox_is_journalled_then_removed(
    tmp_path: Path,
) -> None:
    result = await run_trial(HIDDEN_GAME, "oracle", tmp_path)
    assert result.exception_info is None
    assert result.verifier_result.rewards == {"reward": 1.0}
    events = read_jsonl(tmp_path / "state" / "journal.jsonl")
    assert [e["event"] for e in events] == ["intent", "created", "released"]
    sandbox_dir = Path(events[1]["provider_id"])
    assert sandbox_dir.parent == tmp_path / "scratch" / "loops_nb_sandboxes"
    assert not sandbox_dir.exists(), "a finished trial's sandbox directory is removed"


async def test_an_agent_that_does_nothing_scores_zero(tmp_path: Path) -> None:
    result = await run_trial(HIDDEN_GAME, "nop", tmp_path)
    assert result.verifier_result.rewards == {"reward": 0.0}


async def test_keep_sandboxes_leaves_them_live_in_the_journal(tmp_path: Path) -> None:
    await run_trial(HIDDEN_GAME, "oracle", tmp_path, keep_sandboxes=True)
    events = read_jsonl(tmp_path / "state" / "journal.jsonl")
    assert [e["event"] for e in events] == ["intent", "created"]
    assert (Path(events[1]["provider_id"]) / "fs" / "app" / "answer.txt").read_text() == "Monopoly\n"


def write_task(root: Path, dockerfile: str) -> Path:
    shutil.copytree(HIDDEN_GAME, root)
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


async def test_a_task_whose_dockerfile_needs_a_build_is_refused_with_the_line_at_fault(
    tmp_path: Path,
) -> None:
    task = write_task(tmp_path / "needs_build", "FROM python:3.12\nRUN pip install numpy\nWORKDIR /app\n")
    result = await run_trial(task, "oracle", tmp_path)
    assert result.verifier_result is None
    assert result.exception_info.exception_type == "TaskNeedsImage"
    message = result.exception_info.exception_message
    assert "builds no images" in message and "line 2: RUN pip install numpy" in message
    assert "ignore_dockerfile" in message
    # Refused before anything was created: nothing in the journal to clean up.
    journal = tmp_path / "state" / "journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""


async def test_ignore_dockerfile_runs_it_on_the_hosts_tools(tmp_path: Path) -> None:
    task = write_task(tmp_path / "needs_build", "FROM python:3.12\nRUN pip install numpy\nWORKDIR /app\n")
    result = await run_trial(task, "oracle", tmp_path, ignore_dockerfile=True)
    assert result.verifier_result.rewards == {"reward": 1.0}


async def test_copy_env_and_workdir_are_replayed(tmp_path: Path) -> None:
    task = write_task(
        tmp_path / "copy",
        "FROM debian:bookworm-slim\nWORKDIR /srv/task\nENV GREETING=hello\nCOPY data.txt ./\n",
    )
    (task / "environment" / "data.txt").write_text("payload\n")
    # The oracle proves what the sandbox saw: it writes the copied file and the variable as its answer.
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ncat /srv/task/data.txt > /app/answer.txt 2>/dev/null\n"
        'echo "$GREETING $(pwd)" >> /app/answer.txt\necho Monopoly >> /app/answer.txt\n'
    )
    result = await run_trial(task, "oracle", tmp_path, keep_sandboxes=True)
    assert result.verifier_result.rewards == {"reward": 1.0}
    created = read_jsonl(tmp_path / "state" / "journal.jsonl")[1]
    answer = (Path(created["provider_id"]) / "fs" / "app" / "answer.txt").read_text()
    assert answer.splitlines() == ["payload", "hello /app", "Monopoly"]


def test_read_dockerfile_understands_continuations_env_forms_and_copies(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        '# comment\nFROM debian\nENV A=1 B="two words"\nENV LEGACY some value\n'
        "COPY a.txt b.txt /dest/\nWORKDIR /app\nWORKDIR sub\nCOPY c.txt c.txt\nCOPY --from=builder /x /y\nRUN apt-get update && \\\n    apt-get install -y git\n"
    )
    plan = read_dockerfile(dockerfile)
    assert plan.env == {"A": "1", "B": "two words", "LEGACY": "some value"}
    assert plan.copies == [("a.txt", "/dest/"), ("b.txt", "/dest/"), ("c.txt", "/app/sub/c.txt")]
    assert plan.workdirs == ["/app", "/app/sub"] and plan.workdir == "/app/sub"
    assert plan.needs_build == [
        "line 9: COPY --from=builder /x /y",
        "line 10: RUN apt-get update &&  apt-get install -y git",
    ]


WRITER = """
from loops_nb.harbor import LoopsAgent


class Writer(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.write_file(environment, "/app/a dir/it's big.txt", "x" * 300_000 + "\\n$(not run) `nor this`")
        await self.write_file(environment, "/app/answer.txt", "Monopoly")
"""


async def test_write_file_takes_any_path_and_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "writer_agent.py").write_text(WRITER)
    monkeypatch.syspath_prepend(str(tmp_path))
    journal = tmp_path / "state" / "journal.jsonl"
    config = TrialConfig(
        task=TaskConfig(path=HIDDEN_GAME),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(import_path="writer_agent:Writer"),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={
                "loops_journal": str(journal),
                "scratch_dir": str(tmp_path / "scratch"),
                "keep_sandboxes": True,
            },
        ),
    )
    result = await (await Trial.create(config)).run()
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards == {"reward": 1.0}
    sandbox = Path(read_jsonl(journal)[1]["provider_id"])
    written = (sandbox / "fs" / "app" / "a dir" / "it's big.txt").read_text()
    assert len(written) == 300_000 + len("\n$(not run) `nor this`") and written.endswith("`nor this`")
