"""A stand-in training process for the agent-isolation tests: it holds secrets in its environment from
the start (so they are in its `/proc/<pid>/environ`, as a real run's are) and launches two agent
programs the way loops_nb does, a sibling that waits and the probe.

    python agent_launching_process.py isolated|plain

`plain` launches them as plain subprocesses with the same environment: the probe's control, showing
what it finds when nothing isolates it. Prints the probe's report.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

from loops_nb.model_access import agent_program

PROBE = Path(__file__).with_name("agent_probe.py")
SIBLING = "import sys, time; print('ready', flush=True); sys.stdin.read()"


def attempt(key: str) -> SimpleNamespace:
    return SimpleNamespace(
        services=SimpleNamespace(model_base_url="http://127.0.0.1:9/v1", model_api_key=key)
    )


async def main(isolated: bool) -> None:
    if not isolated:
        agent_program._isolation = []  # as where bubblewrap is missing
    sibling = await agent_program.start_agent_program(
        [sys.executable, "-c", SIBLING],
        attempt("lease-of-the-sibling"),
        stdin=asyncio.subprocess.PIPE,  # type: ignore[arg-type]
    )
    try:
        assert sibling.stdout is not None
        assert (await sibling.stdout.readline()).strip() == b"ready"
        done = await agent_program.run_agent_program(
            [sys.executable, str(PROBE)],
            attempt("lease-of-the-probe"),
            timeout=120,  # type: ignore[arg-type]
        )
        assert done.returncode == 0, done.stderr.decode()
        print(done.stdout.decode(), end="")
    finally:
        await agent_program.stop_agent_program(sibling)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] == "isolated"))
