"""The bubblewrap sandbox: host read-only, writable paths persist, no network, no leaked env, timeouts kill,
and one long-lived namespace per sandbox, so background processes (tmux) survive between commands."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from loops_nb.providers.bubblewrap import BubblewrapSandbox

pytestmark = pytest.mark.bwrap


@pytest_asyncio.fixture(loop_scope="function")  # stop() runs on the loop that started the sandbox
async def sandbox(tmp_path: Path) -> AsyncIterator[BubblewrapSandbox]:
    box = BubblewrapSandbox(tmp_path / "box", ["/logs/verifier", "/tests"], "/app", network=False)
    box.create()
    yield box
    await box.stop()


async def test_writable_paths_persist_across_commands_and_map_to_the_host(sandbox: BubblewrapSandbox) -> None:
    first = await sandbox.run(
        "echo hello > note.txt && mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"
    )
    assert first.return_code == 0, first.stderr
    second = await sandbox.run("cat /app/note.txt; pwd")
    assert second.stdout.split() == ["hello", "/app"]
    assert sandbox.host_path("/logs/verifier/reward.txt").read_text() == "1\n"
    assert sandbox.host_path("/app/note.txt").read_text() == "hello\n"


async def test_the_host_is_read_only_and_outside_writes_fail_loudly(sandbox: BubblewrapSandbox) -> None:
    result = await sandbox.run("touch /usr/loops_nb_probe; echo rc=$?; touch /newfile; echo rc=$?")
    assert "Read-only file system" in result.stderr
    assert result.stdout.split() == ["rc=1", "rc=1"]
    assert not Path("/usr/loops_nb_probe").exists()
    with pytest.raises(FileNotFoundError, match="outside the local sandbox's writable paths"):
        sandbox.host_path("/etc/passwd")


async def test_no_network_means_only_loopback(sandbox: BubblewrapSandbox) -> None:
    result = await sandbox.run("cat /proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
    assert interfaces == ["lo"]


async def test_the_environment_is_cleared_so_run_secrets_never_reach_a_task(
    sandbox: BubblewrapSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASETEN_API_KEY", "secret-key")
    result = await sandbox.run("env", env={"TASK_VAR": "given"})
    assert "secret-key" not in result.stdout
    assert "TASK_VAR=given" in result.stdout


@pytest.mark.timeout(120)
async def test_a_timeout_kills_the_command_and_everything_it_started(sandbox: BubblewrapSandbox) -> None:
    token = f"loops-timeout-probe-{os.getpid()}"  # not `sleep 3600`: other processes on the host may run it
    # An hour of sleep: a timeout that did not kill would hang here until pytest-timeout fails the test, so
    # the test needs no clock of its own.
    with pytest.raises(TimeoutError):
        await sandbox.run(
            f"(exec -a {token} sleep 3600 &) ; echo started > /app/marker; exec -a {token} sleep 3600",
            timeout=1.0,
        )
    assert sandbox.host_path("/app/marker").read_text() == "started\n"
    # Nothing the command started is left running, its orphan included: the whole process group died.
    assert not _live(token)


async def test_a_background_process_started_in_one_command_is_alive_in_the_next(
    sandbox: BubblewrapSandbox,
) -> None:
    started = await sandbox.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > /app/bg.pid")
    assert started.return_code == 0, started.stderr
    pid = sandbox.host_path("/app/bg.pid").read_text().strip()
    # `$!` is known before the background child has exec'd sleep (seen under CI load: "setsid sleep 300").
    exec_d = f"[ \"$(tr '\\0' ' ' < /proc/{pid}/cmdline)\" = 'sleep 300 ' ]"
    alive = await sandbox.run(
        f"for i in $(seq 300); do {exec_d} && break; sleep 0.1; done; "
        f"kill -0 {pid} && tr '\\0' ' ' < /proc/{pid}/cmdline"
    )
    assert alive.return_code == 0, alive.stderr
    assert alive.stdout.strip() == "sleep 300"
    # A timeout kills its own command's process group, never the sandbox or what lives on in it.
    with pytest.raises(TimeoutError):
        await sandbox.run("sleep 60", timeout=0.5)
    assert (await sandbox.run(f"kill -0 {pid}")).return_code == 0


async def test_a_tmux_session_survives_between_commands(sandbox: BubblewrapSandbox) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    made = await sandbox.run("tmux new-session -d -s agent -x 80 -y 24 && tmux ls")
    assert made.return_code == 0, made.stderr
    typed = await sandbox.run(
        "tmux send-keys -t agent 'echo typed-in-tmux > /app/from_tmux.txt; tmux wait -S done' Enter"
        " && timeout 20 tmux wait done"
    )
    assert typed.return_code == 0, typed.stderr
    assert sandbox.host_path("/app/from_tmux.txt").read_text() == "typed-in-tmux\n"
    listed = await sandbox.run("tmux ls")
    assert listed.stdout.startswith("agent:"), listed.stderr


async def test_stop_kills_every_process_in_the_sandbox(sandbox: BubblewrapSandbox) -> None:
    token = f"loops-stop-probe-{os.getpid()}"
    await sandbox.run(f"setsid bash -c 'exec -a {token} sleep 300' > /dev/null 2>&1 < /dev/null &")
    deadline = time.monotonic() + 30  # the command returns before its background child has exec'd
    while not _live(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _live(token), "the background process runs while the sandbox does"
    await sandbox.stop()
    deadline = time.monotonic() + 30  # the kernel tears the PID namespace down after its init dies
    while _live(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _live(token)


def _live(token: str) -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(token)]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


async def test_hidden_paths_are_covered(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("x")
    box = BubblewrapSandbox(tmp_path / "box", [], "/app", hidden=[str(secret)])
    box.create()
    result = await box.run(f"ls -A {secret} | wc -l")
    await box.stop()
    assert result.stdout.strip() == "0"
    assert os.path.exists(secret / "key")


async def test_a_workdir_inside_a_host_directory_keeps_the_rest_of_it_visible(tmp_path: Path) -> None:
    box = BubblewrapSandbox(tmp_path / "box", [], "/usr/src/loops_nb_app")
    box.create()
    result = await box.run(
        "echo made > here.txt && ls /usr/bin/bash && touch /usr/loops_nb_probe 2>&1; cat here.txt"
    )
    await box.stop()
    assert "/usr/bin/bash" in result.stdout, result.stderr
    assert "made" in result.stdout
    assert "Read-only file system" in result.stdout + result.stderr
    assert box.host_path("/usr/src/loops_nb_app/here.txt").read_text() == "made\n"
    assert not Path("/usr/src/loops_nb_app").exists(), "the host itself is untouched"
