"""The resource journal and `loops cleanup`: a killed run's sandboxes are released from its journal."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import start_cli
from rl_config import tiny_run_toml

from loops_nb.cleanup import cleanup
from loops_nb.cli import main
from loops_nb.providers.provider_tables import BlaxelProviderConfig
from loops_nb.resources import ResourceJournal

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"

SLEEPER = """
import asyncio
from loops_nb.harbor import LoopsAgent


class Sleeper(LoopsAgent):
    async def run(self, instruction, environment, context):
        await self.llm.chat([{"role": "user", "content": instruction}], max_tokens=2)
        await self.write_file(environment, "/app/answer.txt", "thinking")
        await asyncio.sleep(3600)
"""


def live_sandboxes(state: Path) -> list[dict]:
    journal = state / "journal.jsonl"
    if not journal.exists():
        return []
    return [vars(e) for e in ResourceJournal(journal).live() if e.status == "created"]


def all_thinking(state: Path) -> bool:
    """Three sandboxes exist and each agent has written its answer: the run is mid-attempt everywhere."""
    live = live_sandboxes(state)
    return len(live) == 3 and all(
        (Path(e["provider_id"]) / "fs" / "app" / "answer.txt").exists() for e in live
    )


@pytest.mark.slow
@pytest.mark.bwrap
def test_cleanup_releases_the_sandboxes_of_a_killed_run(
    tmp_path: Path, tiny_chat_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("harbor")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    config = tmp_path / "train.toml"
    scratch = tmp_path / "scratch"
    config.write_text(
        tiny_run_toml(
            "loops_nb.harbor:create_runtime",
            tiny_chat_model_path,
            tmp_path / "runs",
            options={"tasks": HIDDEN_GAME, "agent": "sleeper:Sleeper", "provider": "sandbox"},
            providers={"sandbox": {"type": "local", "scratch_dir": scratch}},
            training={"group_size": 3, "attempt_timeout_seconds": 3600},
            output={"run_name": "killed"},
        )
    )
    state = tmp_path / "runs" / "killed" / "state"
    proc = start_cli(
        "run",
        config,
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 420
        while not all_thinking(state) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(live_sandboxes(state)) == 3, (
            proc.stderr.read().decode()[-3000:] if proc.poll() is not None else ""
        )

        # While the run lives, cleanup refuses: it would pull sandboxes from under running agents.
        assert main(["cleanup", str(config), "--state-dir", str(state)]) == 2
        assert "still running" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    left = live_sandboxes(state)
    dirs = [Path(e["provider_id"]) for e in left]
    assert all(d.is_dir() for d in dirs), "a killed run leaves its sandbox directories behind"
    assert all((d / "fs" / "app" / "answer.txt").read_text() == "thinking" for d in dirs)

    assert main(["cleanup", str(config), "--state-dir", str(state), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("would release: local sandbox") == 3
    assert all(d.is_dir() for d in dirs), "a dry run releases nothing"

    assert main(["cleanup", str(config), "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out.count("released: local sandbox") == 3
    assert not any(d.exists() for d in dirs)
    assert live_sandboxes(state) == []

    assert main(["cleanup", str(config), "--state-dir", str(state)]) == 0
    assert "nothing to release" in capsys.readouterr().out


def test_cleanup_names_a_wrong_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "runs" / "r1"
    (run / "state").mkdir(parents=True)
    (run / "state" / "journal.jsonl").touch()
    config = REPO / "patterns" / "harbor" / "in_process_direct" / "train_local.toml"
    assert main(["cleanup", str(config), "--state-dir", str(run)]) == 2
    assert "pass the run's state directory" in capsys.readouterr().err


async def test_blaxel_sandboxes_are_deleted_by_name_and_failures_stay_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("blaxel")
    import blaxel.core

    deleted: list[str] = []

    class FakeSandboxInstance:
        @staticmethod
        async def delete(name: str) -> None:
            if name == "broken":
                raise RuntimeError("blaxel is down")
            if name == "gone":
                raise RuntimeError("sandbox not found")
            deleted.append(name)

    monkeypatch.setattr(blaxel.core, "SandboxInstance", FakeSandboxInstance)
    journal = ResourceJournal(tmp_path / "journal.jsonl")
    for name in ("alive", "gone", "broken"):
        entry = journal.intent("blaxel", "sandbox", name=name)
        journal.created(entry, name)
    crashed_before_create = journal.intent(
        "blaxel", "sandbox", name="half"
    )  # intent only: name known upfront
    done = journal.intent("blaxel", "sandbox", name="done")
    journal.created(done, "done")
    journal.released(done)
    assert crashed_before_create.status == "intent"

    report = await cleanup(tmp_path, {"bx": BlaxelProviderConfig()})
    assert deleted == ["alive", "half"]
    assert not report.ok
    assert any("already gone: gone" in line for line in report.released)
    assert len(report.failed) == 1 and "blaxel is down" in report.failed[0]
    assert [e.detail["name"] for e in ResourceJournal(tmp_path / "journal.jsonl").live()] == ["broken"]


async def test_daytona_finds_a_sandbox_journalled_only_as_intent_by_harbors_session_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("daytona")
    import daytona

    calls: list[tuple[str, object]] = []

    class Sandbox:
        def __init__(self, id: str) -> None:
            self.id = id

    class FakeDaytona:
        async def __aenter__(self) -> FakeDaytona:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def get(self, sandbox_id: str) -> Sandbox:
            return Sandbox(sandbox_id)

        async def delete(self, sandbox: Sandbox) -> None:
            calls.append(("delete", sandbox.id))

        async def list(self, query: object):
            calls.append(("list", query.labels))
            yield Sandbox("found-by-label")

    monkeypatch.setattr(daytona, "AsyncDaytona", FakeDaytona)
    monkeypatch.setattr(daytona, "ListSandboxesQuery", lambda labels: type("Q", (), {"labels": labels})())
    journal = ResourceJournal(tmp_path / "journal.jsonl")
    created = journal.intent("daytona", "sandbox", session="t1__abc__env")
    journal.created(created, "sb-123")
    journal.intent("daytona", "sandbox", session="t2__def__env")

    report = await cleanup(tmp_path, {})
    assert report.ok
    assert calls == [
        ("delete", "sb-123"),
        ("list", {"harbor.session_id": "t2__def__env"}),
        ("delete", "found-by-label"),
    ]
    assert ResourceJournal(tmp_path / "journal.jsonl").live() == []
