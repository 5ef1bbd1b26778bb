"""Agent programs get their lease and nothing else of the run's: an allowlisted environment, and (under
bubblewrap) no view of the training process's or another attempt's environment, so a sibling's lease
cannot be borrowed to sample, and be trained, as that attempt."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loops_nb.model_access import (
    LeasedRuntime,
    ModelAccessMode,
    ModelGateway,
    agent_env,
    agent_process_env,
    agent_program,
)
from loops_nb.runtime import Attempt, AttemptServices, Evidence, Task

HERE = Path(__file__).parent
PROBE = HERE / "agent_probe.py"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "canary-aws-secret",
    "GITHUB_TOKEN": "canary-github-token",
    "FROM_DOT_ENV": "canary-dot-env",
    "BASETEN_API_KEY": "canary-baseten",
}
CAN_ISOLATE = asyncio.run(agent_program._probe()) != []
needs_bwrap = pytest.mark.skipif(not CAN_ISOLATE, reason="bubblewrap cannot create namespaces here")


def fake_attempt(key: str) -> Any:
    return SimpleNamespace(
        services=SimpleNamespace(model_base_url="http://127.0.0.1:9/v1", model_api_key=key)
    )


def test_agent_programs_inherit_an_allowlist_not_everything_but_known_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MY_TOOL_HOME", "/opt/tool")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = agent_process_env(fake_attempt("lease-1"))
    assert not set(SECRETS) & set(env), sorted(env)
    assert env["OPENAI_API_KEY"] == "lease-1" and env["PATH"] == os.environ["PATH"]
    assert env["LC_ALL"] == "C.UTF-8" and "MY_TOOL_HOME" not in env
    # The OpenAI Agents SDK would export traces to OpenAI with the lease key as OPENAI_API_KEY.
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    with agent_env.passing_env(["MY_TOOL_HOME"]):  # what [runtime] agent_env names
        assert agent_process_env(fake_attempt("lease-1"))["MY_TOOL_HOME"] == "/opt/tool"
    with agent_env.passing_env(["BASETEN_API_KEY"]), pytest.raises(ValueError, match="credentials"):
        agent_process_env(fake_attempt("lease-1"))


def test_the_config_names_what_agent_programs_inherit_and_never_the_runs_credentials() -> None:
    from pydantic import ValidationError

    from loops_nb.rl.config import RuntimeConfig

    assert RuntimeConfig(factory="m:f", agent_env=["MY_TOOL_HOME"]).agent_env == ["MY_TOOL_HOME"]
    for bad in ("HF_TOKEN", "OPENAI_API_KEY", "NOT A NAME"):
        with pytest.raises(ValidationError, match="agent_env"):
            RuntimeConfig(factory="m:f", agent_env=[bad])


def probe_report(mode: str) -> dict[str, Any]:
    # The stand-in training process gets the secrets at exec, so they are in its /proc/<pid>/environ.
    env = {**os.environ, **SECRETS}
    done = subprocess.run(
        [sys.executable, str(HERE / "agent_launching_process.py"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@needs_bwrap
def test_an_agent_program_cannot_read_its_parent_or_a_siblings_environment() -> None:
    report = probe_report("isolated")
    found = json.dumps(report)
    assert report["foreign_keys"] == [], "read another attempt's lease"
    assert "lease-of-the-sibling" not in found
    assert not [v for v in SECRETS.values() if v in found], "reached the training process's secrets"
    # /proc/$PPID is bwrap's init, started with the program's own allowlisted environment.
    assert report["parent_environ"].get("OPENAI_API_KEY") in (None, "lease-of-the-probe")


def test_the_probe_finds_the_parent_and_the_sibling_when_nothing_isolates_it() -> None:
    """The control: the same probe, launched as a plain subprocess (bubblewrap missing), sees both."""
    report = probe_report("plain")
    assert report["foreign_keys"] == ["lease-of-the-sibling"]
    assert report["parent_environ"]["AWS_SECRET_ACCESS_KEY"] == SECRETS["AWS_SECRET_ACCESS_KEY"]
    assert not [v for v in SECRETS.values() if v in json.dumps(report["own_environ"])]


VICTIM = (
    "import json, os, sys, urllib.request\n"
    "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'mine'}]}).encode()\n"
    "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body,\n"
    "    headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
    "print(urllib.request.urlopen(req, timeout=60).status, flush=True)\n"
    "sys.stdin.read()\n"
)


class VictimAndThief:
    """Attempt 0 calls the model once and stays alive; attempt 1 hunts /proc for its lease and uses it."""

    model_access = ModelAccessMode.OPENAI_HTTP

    def __init__(self) -> None:
        self.victim_ready = asyncio.Event()
        self.thief_done = asyncio.Event()
        self.report: dict[str, Any] = {}

    async def tasks(self) -> Sequence[Task]:
        return [Task("t")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        if attempt.index == 0:
            victim = await agent_program.start_agent_program(
                [sys.executable, "-c", VICTIM], attempt, stdin=asyncio.subprocess.PIPE
            )
            try:
                assert victim.stdout is not None
                assert (await victim.stdout.readline()).strip() == b"200"
                self.victim_ready.set()
                await asyncio.wait_for(self.thief_done.wait(), 120)
            finally:
                await agent_program.stop_agent_program(victim)
        else:
            await asyncio.wait_for(self.victim_ready.wait(), 120)
            try:
                done = await agent_program.run_agent_program(
                    [sys.executable, str(PROBE), "GATEWAY_STEAL"], attempt, timeout=120
                )
                assert done.returncode == 0, done.stderr.decode()
                self.report = json.loads(done.stdout)
            finally:
                self.thief_done.set()
        return Evidence(reward=1.0)

    async def close(self) -> None:
        pass


async def _victim_calls(scripted: Any) -> tuple[int, dict[str, Any]]:
    runtime = VictimAndThief()
    victim_llm, _ = scripted("mine", "stolen", "stolen")
    thief_llm, _ = scripted("theirs")
    with ModelGateway() as gateway:
        leased = LeasedRuntime(runtime, gateway)
        await asyncio.gather(
            leased.run_attempt(
                Attempt(Task("t"), 0, 0, 1, 0, AttemptServices(victim_llm, victim_llm.capture))
            ),
            leased.run_attempt(Attempt(Task("t"), 0, 1, 2, 0, AttemptServices(thief_llm, thief_llm.capture))),
        )
    return len(victim_llm.capture.calls), runtime.report


@needs_bwrap
async def test_a_sibling_cannot_borrow_a_lease_into_another_attempts_training_data(scripted: Any) -> None:
    calls, report = await _victim_calls(scripted)
    assert report["foreign_keys"] == [] and report["stolen_calls"] == {}
    assert calls == 1, "the victim's capture holds calls it never made"


async def test_without_isolation_the_thief_does_borrow_the_lease(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: the same thief, with bubblewrap unavailable, succeeds."""
    monkeypatch.setattr(agent_program, "_isolation", [])
    monkeypatch.setattr(agent_program, "_warned", True)
    calls, report = await _victim_calls(scripted)
    assert list(report["stolen_calls"].values()) == [200]
    assert calls == 2


async def test_without_bubblewrap_programs_still_run_and_a_warning_says_what_is_open(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(agent_program.shutil, "which", lambda name: None)
    monkeypatch.setattr(agent_program, "_isolation", None)
    monkeypatch.setattr(agent_program, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=agent_program.__name__):
        for _ in range(2):
            done = await agent_program.run_agent_program(
                [sys.executable, "-c", "print('ran')"], fake_attempt("lease-1"), timeout=60
            )
            assert done.stdout.strip() == b"ran"
    warnings = [r for r in caplog.records if "without process isolation" in r.getMessage()]
    assert len(warnings) == 1, "warned once per process"


async def test_a_timed_out_program_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(TimeoutError):
        await agent_program.run_agent_program([sys.executable, "-c", script], fake_attempt("k"), timeout=5)
    # The pid is the namespace's under bubblewrap; either way no process of the program's is left.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "time.sleep(600)" not in ps


@needs_bwrap
async def test_the_harbor_program_agent_launches_through_the_same_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("harbor")
    from loops_nb.harbor.program_agent import LoopsProgramAgent

    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    agent = LoopsProgramAgent(logs_dir=tmp_path, command=["python", str(PROBE)])
    agent.attempt = fake_attempt("lease-of-the-trial")
    written: dict[str, str] = {}

    async def write_file(environment: Any, path: str, content: str) -> None:
        written[path] = content

    monkeypatch.setattr(agent, "write_file", write_file)
    sibling = await agent_program.start_agent_program(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        fake_attempt("lease-of-another-trial"),
        stdin=asyncio.subprocess.PIPE,
    )
    try:
        assert sibling.stdout is not None and (await sibling.stdout.readline()).strip() == b"ready"
        await agent.run("find what you should not", None, None)  # type: ignore[arg-type]
    finally:
        await agent_program.stop_agent_program(sibling)
    report = json.loads(written["/app/answer.txt"])
    assert report["own_key"] == "lease-of-the-trial" and report["foreign_keys"] == []
    assert not [v for v in SECRETS.values() if v in json.dumps(report)]
