"""`episodes = "shared"`: one verifiers process (the driver's `serve`) runs every attempt's episode.

Loaded once instead of once an attempt, at the price of isolation: it holds the key of every attempt
running. docs/reference/verifiers.md has the trade ("One process per attempt, or one for all") and the
protocol ("The episode driver"). An episode past its timeout is cancelled; when the cancel is not answered
within `CANCEL_GRACE_SECONDS`, or the process dies, every episode in flight ends as that process's death.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid

from loops_nb.model_access.agent_program import start_agent_program, stop_agent_program
from loops_nb.verifiers.driver_process import DriverOutcome, parse_result

log = logging.getLogger(__name__)

CANCEL_GRACE_SECONDS = 10.0
STDERR_KEPT = 20_000


class ServerGone(Exception):
    """The shared process could not start, or ended (its outcome says how)."""

    def __init__(self, outcome: DriverOutcome) -> None:
        super().__init__(outcome.reason())
        self.outcome = outcome


class EpisodeServer:
    """One `episode_driver.py serve` process and the episodes waiting on it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[str, asyncio.Future[DriverOutcome]] = {}
        self.stderr = ""
        self.ready: dict[str, object] = {}
        """The ready line: `list`'s object."""
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, timeout: float) -> None:
        """Start the process and wait for its `ready` line (ServerGone when it fails to load)."""
        self.proc = proc = await start_agent_program(
            self.argv, None, env=self.env, stdin=asyncio.subprocess.PIPE
        )
        self._tasks.append(asyncio.create_task(self._drain_stderr()))
        assert proc.stdout is not None
        try:
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), timeout)
                if not line:
                    await proc.wait()
                    await asyncio.sleep(0)  # let stderr's last lines arrive
                    raise ServerGone(DriverOutcome(proc.returncode, None, self.stderr))
                ready, _ = parse_result(line)
                if ready is not None and ready.get("ready"):
                    self.ready = ready
                    break
        except TimeoutError:
            await self.stop()
            raise ServerGone(DriverOutcome(None, None, self.stderr)) from None
        self._tasks.append(asyncio.create_task(self._read_results()))

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for line in self.proc.stderr:
            self.stderr = (self.stderr + line.decode(errors="replace"))[-STDERR_KEPT:]

    async def _read_results(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            result, _ = parse_result(line)
            if result is None:
                continue
            future = self.pending.pop(str(result.get("id")), None)
            if future is not None and not future.done():
                future.set_result(DriverOutcome(0, result, ""))
        await self.proc.wait()
        self._fail_all()

    def _fail_all(self) -> None:
        """Every episode in flight ends as the process did."""
        code = self.proc.returncode if self.proc is not None else None
        if code is None or code == 0:
            gone = DriverOutcome(
                0, None, self.stderr, "the shared verifiers process ended before the episode did"
            )
        else:
            gone = DriverOutcome(code, None, self.stderr)
        for future in self.pending.values():
            if not future.done():
                future.set_result(gone)
        self.pending.clear()

    def _send(self, obj: dict[str, object]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())

    async def run(self, request: dict[str, object], timeout: float) -> DriverOutcome:
        """One episode; a timed-out one is cancelled (and the process replaced if it does not answer)."""
        request_id = uuid.uuid4().hex
        future: asyncio.Future[DriverOutcome] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        try:
            self._send({"id": request_id, **request})
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            await self._cancel(request_id, future)
            return DriverOutcome(None, None, "")
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self._send({"cancel": request_id})
            raise
        except (BrokenPipeError, ConnectionResetError):
            await self.stop()
            if future.done():
                return future.result()
            return DriverOutcome(0, None, self.stderr, "the shared verifiers process had ended")
        finally:
            self.pending.pop(request_id, None)

    async def _cancel(self, request_id: str, future: asyncio.Future[DriverOutcome]) -> None:
        with contextlib.suppress(Exception):
            self._send({"cancel": request_id})
        try:
            await asyncio.wait_for(asyncio.shield(future), CANCEL_GRACE_SECONDS)
        except TimeoutError:
            log.warning("the shared verifiers process did not answer a cancel; restarting it")
            await self.stop()

    async def stop(self) -> None:
        """Kill the process (and what it started); episodes in flight end as its death."""
        if self.proc is not None:
            await stop_agent_program(self.proc)
        self._fail_all()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
