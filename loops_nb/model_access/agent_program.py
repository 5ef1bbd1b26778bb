"""Launching an agent program: an allowlisted environment (agent_env.py) and, on Linux, a PID namespace of its own.

Under `bwrap --unshare-pid` with its own /proc, the program sees neither the training process nor the other
attempts' programs, so it cannot read a sibling's lease key and sample (and be trained) as that attempt. Files
and network are the host's: this isolates processes, it is not a sandbox. Where bubblewrap cannot create
namespaces, programs run as plain subprocesses and a warning says, once, what that leaves open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loops_nb.model_access.agent_env import agent_process_env
from loops_nb.runtime import Attempt

log = logging.getLogger(__name__)

# -- isolation ------------------------------------------------------------------------------------
ISOLATION_ARGS = ("--die-with-parent", "--unshare-pid", "--dev-bind", "/", "/", "--proc", "/proc")
"""The host's filesystem and network as they are, a PID namespace and a /proc of the program's own."""

_isolation: list[str] | None = None  # the bwrap prefix, [] when unavailable; probed once per process
_warned = False


async def isolation_prefix() -> list[str]:
    """The argv prefix that isolates an agent program ([] where bubblewrap cannot, with a warning)."""
    global _isolation, _warned
    if _isolation is None:
        _isolation = await _probe()
    if not _isolation and not _warned:
        _warned = True
        log.warning(
            "agent programs run without process isolation: bubblewrap (`bwrap`) is missing or cannot "
            "create namespaces here, so an agent program can read the training process's and other "
            "attempts' environments through /proc, their lease keys included. Install bubblewrap "
            "(`apt-get install bubblewrap`) where the run's agents must not reach each other."
        )
    return list(_isolation)


async def _probe() -> list[str]:
    found = shutil.which("bwrap")
    if found is None:
        return []
    prefix = [found, *ISOLATION_ARGS, "--"]
    try:
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            "true",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, TimeoutError):
        return []
    if proc.returncode != 0:
        log.info("bwrap cannot isolate agent programs here: %s", err.decode(errors="replace").strip())
        return []
    return prefix


# -- launching ------------------------------------------------------------------------------------
async def start_agent_program(
    argv: Sequence[str],
    attempt: Attempt | None = None,
    *,
    cwd: str | Path | None = None,
    stdin: int | None = asyncio.subprocess.DEVNULL,
    stdout: int | None = asyncio.subprocess.PIPE,
    stderr: int | None = asyncio.subprocess.PIPE,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start `argv` as the agent program of `attempt` (default: the running one), isolated.

    `env` replaces `agent_process_env(attempt)`. The program leads its own process group: end it with
    `stop_agent_program`, which takes down everything it started.
    """
    prefix = await isolation_prefix()
    return await asyncio.create_subprocess_exec(
        *prefix,
        *argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=dict(env) if env is not None else agent_process_env(attempt),
        cwd=str(cwd) if cwd is not None else None,
        start_new_session=True,
    )


async def stop_agent_program(proc: asyncio.subprocess.Process) -> None:
    """Kill the program and what it started, if it is still running, and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


@dataclass(frozen=True)
class AgentProgramResult:
    returncode: int
    stdout: bytes
    stderr: bytes


async def run_agent_program(
    argv: Sequence[str],
    attempt: Attempt | None = None,
    *,
    input: bytes | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentProgramResult:
    """Run an agent program to its end: `input` on its stdin, its output collected (`env` as in
    `start_agent_program`).

    Raises TimeoutError past `timeout`; then, or when the caller is cancelled (an attempt's timeout),
    the program and everything it started are killed, so no agent outlives its attempt.
    """
    proc = await start_agent_program(
        argv,
        attempt,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    finally:
        await stop_agent_program(proc)
    return AgentProgramResult(proc.returncode if proc.returncode is not None else -1, out, err)
