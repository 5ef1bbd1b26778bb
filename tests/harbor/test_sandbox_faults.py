"""A local sandbox that dies mid-attempt: its bwrap killed from outside, or its directory removed.

The attempt is discarded as `error` with the cause, never graded (not even when the agent swallows the
error and answers anyway), its sandbox is journalled released, and no process or directory is left.
The faults come from outside the sandbox: a SIGKILL to the bwrap process of a running command, and the
removal of the sandbox directory the journal names.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial
from helpers import read_jsonl
from test_harbor_runtime import HIDDEN_GAME, harbor_config_toml, journal, rollouts
from test_local_environment import run_trial

import loops_nb
from loops_nb.harbor import LoopsAgent
from loops_nb.harbor.evidence import evidence_from_trial
from loops_nb.providers.adapters import LocalProvider
from loops_nb.providers.bubblewrap import BubblewrapSandbox, remove_tree
from loops_nb.providers.provider_tables import LocalProviderConfig
from loops_nb.resources import ResourceJournal

pytestmark = pytest.mark.bwrap

TOKEN = "loops-fault-victim"  # in the command line of every process of the command the fault hits


# -- injecting faults from outside the sandbox -------------------------------------------------------
def _processes(token: str) -> list[tuple[int, int, list[str]]]:
    """(pid, parent pid, argv) of live processes whose command line mentions `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z" and any(token in arg for arg in argv):
            found.append((int(entry.name), int(ppid), argv))
    return found


def _parent(pid: int) -> tuple[int, str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return 0, ""
    return int(stat.rsplit(")", 1)[1].split()[1]), argv0


async def kill_bwrap_running(token: str) -> int:
    """SIGKILL the bwrap process (a child of this process) of the command whose process mentions `token`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid, _, _ in _processes(token):
            while pid > 1:  # up to the bwrap this process started
                ppid, argv0 = _parent(pid)
                if ppid == os.getpid() and argv0.endswith("bwrap"):
                    os.kill(pid, signal.SIGKILL)
                    return pid
                pid = ppid
        await asyncio.sleep(0.05)
    raise AssertionError(f"no bwrap process running {token!r} appeared")


async def assert_no_process_left(token: str) -> None:
    deadline = time.monotonic() + 30  # the kernel tears a PID namespace down after its init dies
    while _processes(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _processes(token), "every process of the killed command is gone"


def remove_live_sandboxes(journal_path: Path) -> list[Path]:
    """Delete the directory of every sandbox the journal says is live, as a host-side cleaner would."""
    paths = [Path(e.provider_id) for e in ResourceJournal.at(journal_path).live() if e.provider_id]
    for path in paths:
        shutil.rmtree(path)
    return paths


class Faulty(LoopsAgent):
    """Hits its own sandbox with `fault`, then tries to answer right anyway.

    `careless` swallows every sandbox error, as a sloppy agent would: the attempt must still be
    discarded, because the verifier cannot grade a dead sandbox either. In a training run only attempt 0
    is hit; the other attempts answer right when their index is even.
    """

    def __init__(
        self, *args: Any, fault: str = "kill", careless: bool = True, journal: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fault, self.careless, self.journal = fault, careless, journal

    async def run(self, instruction, environment, context) -> None:  # type: ignore[no-untyped-def]
        reply = None
        if self.attempt is not None:  # a training run: a model call, so kept attempts train
            reply = await self.llm.chat([{"role": "user", "content": instruction}], max_tokens=4)
            self.transcript.append(reply.message)
        hit = self.attempt is None or self.attempt.index == 0
        try:
            if hit and self.fault == "kill":
                command = asyncio.ensure_future(environment.exec(f"exec -a {TOKEN} sleep 60"))
                await kill_bwrap_running(TOKEN)
                await command
            elif hit and self.fault == "remove_mid_agent":
                await environment.exec("echo working > /app/notes.txt")
                remove_live_sandboxes(Path(self.journal))
            right = hit or self.attempt is None or self.attempt.index % 2 == 0
            await self.write_file(environment, "/app/answer.txt", "Monopoly" if right else reply.content)
            if hit and self.fault == "remove_before_verifier":
                remove_live_sandboxes(Path(self.journal))
        except Exception:
            if not self.careless:
                raise


# -- one trial ---------------------------------------------------------------------------------------
async def run_faulty_trial(tmp_path: Path, fault: str, task: Path = HIDDEN_GAME) -> Any:
    journal_path = tmp_path / "state" / "journal.jsonl"
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(
            import_path=f"{__name__}:Faulty", kwargs={"fault": fault, "journal": str(journal_path)}
        ),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"loops_journal": str(journal_path), "scratch_dir": str(tmp_path / "scratch")},
        ),
    )
    return await (await Trial.create(config)).run()


def assert_released_and_removed(tmp_path: Path) -> None:
    events = read_jsonl(tmp_path / "state" / "journal.jsonl")
    assert [e["event"] for e in events] == ["intent", "created", "released"]
    assert not list((tmp_path / "scratch" / "loops_nb_sandboxes").iterdir()), "no sandbox directory is left"


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("kill", "its bwrap process was killed by SIGKILL from outside the sandbox"),
        ("remove_mid_agent", "was removed from the host while the trial ran"),
        ("remove_before_verifier", "was removed from the host while the trial ran"),
    ],
)
async def test_a_sandbox_that_dies_mid_attempt_is_discarded_not_graded(
    tmp_path: Path, fault: str, cause: str
) -> None:
    result = await run_faulty_trial(tmp_path, fault)
    # The agent swallowed the error and wrote the right answer: before the fix, a killed command was
    # graded (reward 1 here, 0 for a real agent cut short) and trained on.
    assert result.verifier_result is None, "a dead sandbox is never graded"
    assert result.exception_info.exception_type == "SandboxDied"
    evidence = evidence_from_trial(result)
    assert evidence.discarded == "error" and evidence.reward is None
    assert evidence.detail.startswith("SandboxDied: the local sandbox died:") and cause in evidence.detail
    assert_released_and_removed(tmp_path)
    await assert_no_process_left(TOKEN)


async def test_a_verifier_whose_bwrap_is_killed_is_discarded_even_after_writing_a_reward(
    tmp_path: Path,
) -> None:
    task = tmp_path / "tasks" / "slow_verifier"
    shutil.copytree(HIDDEN_GAME, task)
    # The reward is on disk before the kill: Harbor ignores the script's exit code and would grade it.
    (task / "tests" / "test.sh").write_text(
        f"#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\nexec -a {TOKEN} sleep 60\n"
    )
    killer = asyncio.ensure_future(kill_bwrap_running(TOKEN))
    result = await run_trial(task, "oracle", tmp_path)
    await killer
    assert result.verifier_result is None
    evidence = evidence_from_trial(result)
    assert evidence.discarded == "error"
    assert "SandboxDied" in evidence.detail and "killed by SIGKILL" in evidence.detail
    assert_released_and_removed(tmp_path)
    await assert_no_process_left(TOKEN)


async def test_a_sandbox_that_cannot_be_removed_stays_live_for_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BubblewrapSandbox, "remove", lambda self: False)  # an rmtree that failed
    result = await run_trial(HIDDEN_GAME, "oracle", tmp_path)
    assert result.verifier_result.rewards == {"reward": 1.0}
    journal_path = tmp_path / "state" / "journal.jsonl"
    assert [e["event"] for e in read_jsonl(journal_path)] == ["intent", "created"], "never released"
    (entry,) = ResourceJournal.at(journal_path).live()
    monkeypatch.undo()
    provider = LocalProvider("local", LocalProviderConfig(type="local"))
    assert (await provider.release(entry)).startswith("removed ")
    assert not Path(entry.provider_id).exists()


def test_remove_tree_removes_what_a_task_made_read_only(tmp_path: Path) -> None:
    root = tmp_path / "loops_nb_sandboxes" / "box"
    (root / "fs" / "app" / "ro").mkdir(parents=True)
    (root / "fs" / "app" / "ro" / "f").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "fs" / "app" / "link").symlink_to(outside)
    os.chmod(root / "fs" / "app" / "ro", 0o555)
    os.chmod(outside, 0o500)
    assert remove_tree(root) and not root.exists()
    assert outside.stat().st_mode & 0o777 == 0o500, "a link out of the sandbox is not followed"
    os.chmod(outside, 0o700)


# -- a training step ---------------------------------------------------------------------------------
@pytest.mark.slow
async def test_a_step_trains_on_the_attempts_whose_sandboxes_lived(
    tmp_path: Path, tiny_chat_model_path: Path
) -> None:
    (tmp_path / "harbor_agents.py").write_text(
        f"from {__name__} import Faulty\n\n\nclass Careful(Faulty):\n    pass\n"
    )
    config = tmp_path / "Careful.toml"
    config.write_text(
        harbor_config_toml(
            tmp_path, tiny_chat_model_path, "Careful", agent_kwargs={"fault": "kill", "careless": False}
        )
    )
    outcome = await loops_nb.load(config).train()
    run = Path(outcome.run_dir)
    records = rollouts(run)
    assert len(records) == 4
    (dead,) = [r for r in records if r["discarded"]]
    assert dead["discarded"] == "error" and dead["reward"] is None and not dead["trained"]
    assert "SandboxDied" in dead["detail"] and "killed by SIGKILL" in dead["detail"]
    kept = [r for r in records if not r["discarded"]]
    assert len(kept) == 3 and all(r["reward"] is not None for r in kept)
    assert sorted(r["reward"] for r in kept)[-1] == 1.0 and any(r["trained"] for r in kept)
    (step,) = read_jsonl(run / "steps.jsonl")
    assert step["attempts/discarded"] == 1 and step["discarded/error"] == 1 and step["trained"]
    events = journal(run)
    created = sorted(e["key"] for e in events if e["event"] == "created")
    assert len(created) == 4 and created == sorted(e["key"] for e in events if e["event"] == "released")
    assert not list((tmp_path / "scratch" / "loops_nb_sandboxes").iterdir())
    await assert_no_process_left(TOKEN)
    assert len(list((run / "harbor_trials").iterdir())) == 1, "the discarded trial's directory is kept"
