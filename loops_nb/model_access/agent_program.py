"""Launching an agent program: an allowlisted environment and, on Linux, a PID namespace of its own.

An agent that is its own program may hold one thing of the run's: its attempt's lease key. So:

- Its environment is built from an allowlist (`BASE_VARIABLES`, `LC_*`, the names in
  `[runtime] agent_env`, then `OPENAI_BASE_URL` / `OPENAI_API_KEY` of its lease, and
  `OPENAI_AGENTS_DISABLE_TRACING=1` so no framework sends the lease to its vendor), never by removing
  known secrets from ours: an `AWS_SECRET_ACCESS_KEY`, a `GITHUB_TOKEN` or a line of `.env` is not
  on any list of the run's credentials.
- It runs under bubblewrap (`bwrap --unshare-pid`), with its own /proc. Its parent there is bwrap's
  init, started with the same allowlisted environment, so `/proc/$PPID/environ` gives back only what
  it already has; the training process and the other attempts' programs are not in its /proc at all,
  so it cannot read a sibling's lease key and sample (and be trained) as that attempt. The filesystem
  and the network are the host's, as for any subprocess: this isolates processes, it is not a sandbox
  for files.

Where bubblewrap is missing or cannot create namespaces (macOS, a container without user
namespaces), programs run as plain subprocesses and a warning says, once, what that leaves open.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import re
import shutil
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loops_nb.runtime import Attempt

log = logging.getLogger(__name__)

BASE_VARIABLES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
"""What every agent program inherits from the training process (plus `LC_*`)."""

LEASE_VARIABLES = frozenset({"OPENAI_BASE_URL", "OPENAI_API_KEY"})
"""Set from the attempt's lease; a program never inherits the training process's values of these."""

SECRET_VARIABLES = frozenset(
    {
        "BASETEN_API_KEY",
        "LOOPS_LOCAL_API_KEY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "WANDB_API_KEY",
        "BL_API_KEY",
        "BL_CLIENT_CREDENTIALS",
        "DAYTONA_API_KEY",
        "DAYTONA_JWT_TOKEN",
        "ANTHROPIC_API_KEY",
    }
)
"""The run's own credentials: `[runtime] agent_env` may not pass them to agent programs."""

QUIET_FRAMEWORKS = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}
"""Set for every agent program (unless `[runtime] agent_env` passes the name): the OpenAI Agents SDK
otherwise exports traces to OpenAI's servers, authenticated with `OPENAI_API_KEY`, the lease key."""

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_passed_names: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "loops_nb_agent_env", default=()
)


def refused_agent_env_name(name: str) -> str | None:
    """Why `[runtime] agent_env` may not name `name`, or None when it may."""
    if not ENV_NAME.match(name):
        return f"{name!r} is not an environment variable name"
    if name in SECRET_VARIABLES:
        return f"{name} is one of the run's credentials, which agent programs never get"
    if name in LEASE_VARIABLES:
        return f"{name} is set from the attempt's lease"
    return None


@contextlib.contextmanager
def passing_env(names: Iterable[str]) -> Any:
    """Within this block (an attempt), agent programs also inherit these variables (`[runtime] agent_env`)."""
    token = _passed_names.set(tuple(names))
    try:
        yield
    finally:
        _passed_names.reset(token)


def agent_process_env(attempt: Attempt | None = None, *, extra: Iterable[str] = ()) -> dict[str, str]:
    """The environment to launch an agent program with: PATH, HOME and the locale of this process,
    the variables `[runtime] agent_env` (and `extra`) name, and the attempt's `OPENAI_BASE_URL` /
    `OPENAI_API_KEY`, with loopback kept off any proxy and frameworks' tracing to their vendors off
    (`QUIET_FRAMEWORKS`)."""
    from loops_nb.model_access.runtime import model_env

    named = {*_passed_names.get(), *extra}
    for name in named:
        why = refused_agent_env_name(name)
        if why is not None:
            raise ValueError(f"agent program environment: {why}")
    env = dict(QUIET_FRAMEWORKS)
    env.update(
        (k, v) for k, v in os.environ.items() if k in BASE_VARIABLES or k.startswith("LC_") or k in named
    )
    env.update(model_env(attempt))
    loopback = "127.0.0.1,localhost"
    env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY"), loopback]))
    return env


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


def reset_isolation_probe() -> None:
    """Probe again at the next launch (tests, or after installing bubblewrap)."""
    global _isolation, _warned
    _isolation, _warned = None, False


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
) -> AgentProgramResult:
    """Run an agent program to its end: `input` on its stdin, its output collected.

    Raises TimeoutError past `timeout`; then, or when the caller is cancelled (an attempt's timeout),
    the program and everything it started are killed, so no agent outlives its attempt.
    """
    proc = await start_agent_program(
        argv,
        attempt,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    finally:
        await stop_agent_program(proc)
    return AgentProgramResult(proc.returncode if proc.returncode is not None else -1, out, err)
