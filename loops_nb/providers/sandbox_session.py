"""The host side of a long-lived local sandbox: one `bwrap` per sandbox, and a supervisor inside it.

`SupervisorSession.start` launches bwrap running `sandbox_supervisor.py`; each `run` sends it one command,
with the files its output goes to, and waits for its exit code. The sandbox dies only with its bwrap: `stop()`,
the training process exiting (`--die-with-parent`), or a kill from outside, which fails the commands in
flight and every later one with `SandboxDied`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from loops_nb.errors import SandboxError

START_TIMEOUT = 60.0
"""Seconds for bwrap to set its mounts up and the supervisor to say it is ready."""
KILL_GRACE = 10.0
"""Seconds a timed-out command's process group gets to be reaped after its SIGKILL."""


class SandboxUnavailable(SandboxError):
    """bubblewrap is missing or cannot create namespaces here."""


class SandboxDied(SandboxError):
    """The sandbox died under a running trial: its `bwrap` was killed, or its host directory was removed.

    Not the task's doing and not the model's: the attempt must be discarded, never graded. The message
    never says "timed out" (nor quotes the command, which might), so agents that answer a timeout to the
    model as its own mistake (`ShellAgent`) raise this one instead.
    """


@dataclass(frozen=True)
class CommandResult:
    return_code: int
    stdout: str
    stderr: str


class SupervisorSession:
    """The running bwrap of one sandbox, and the commands in flight in it.

    Not tied to an event loop: a thread reads the supervisor's answers and resolves each command's
    future on the loop that awaits it, so a sandbox started on one loop (a fixture, a notebook cell)
    serves commands on another.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._lock = threading.Lock()  # _pending and _died, shared with the reader thread
        self._ids = itertools.count(1)
        self._died: str | None = None
        self._stopped = False
        self._log: IO[bytes] | None = None
        self._ready: concurrent.futures.Future[None] | None = None

    async def start(self, argv: Callable[[int], list[str]]) -> None:
        """Launch bwrap (once; concurrent first commands wait for the same start) and wait for the
        supervisor's ready line."""
        if self._ready is not None:
            await asyncio.wrap_future(self._ready)
            return
        if self._stopped:
            raise RuntimeError("the local sandbox was stopped")
        self._ready = concurrent.futures.Future()
        try:
            proc = self._launch(argv)
            assert proc.stdout is not None
            ready = await asyncio.to_thread(_readline, proc.stdout, START_TIMEOUT)
            if b'"ready"' not in ready:
                _kill_group(proc.pid)
                await asyncio.to_thread(proc.wait)
                raise SandboxUnavailable(f"the local sandbox did not start: {self._complaints()}")
        except BaseException as exc:
            interrupted = isinstance(exc, asyncio.CancelledError)
            self._ready.set_exception(
                SandboxUnavailable("the local sandbox's start was interrupted") if interrupted else exc
            )
            await self.stop()
            raise
        self._reader = threading.Thread(target=self._read_answers, args=(proc,), daemon=True)
        self._reader.start()
        self._ready.set_result(None)

    def _launch(self, argv: Callable[[int], list[str]]) -> subprocess.Popen[bytes]:
        # On the caller's thread, not a worker's: `--die-with-parent` follows the thread that forked.
        host_end, box_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # bwrap's and the supervisor's own complaints; open until stop(), so no `with`
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv(box_end.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._log,
                pass_fds=(box_end.fileno(),),
                start_new_session=True,  # one process group: stop() kills bwrap and its init
            )
        except BaseException:
            host_end.close()
            raise
        finally:
            box_end.close()
        host_end.settimeout(KILL_GRACE)
        self._proc, self._control = proc, host_end
        return proc

    async def run(
        self,
        argv: Callable[[int], list[str]],
        command: str,
        cwd: str,
        env: Mapping[str, str],
        timeout: float | None,
    ) -> CommandResult:
        await self.start(argv)
        request_id = next(self._ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                with tempfile.TemporaryFile() as spec:
                    spec.write(json.dumps({"command": command, "cwd": cwd, "env": dict(env)}).encode())
                    spec.seek(0)
                    with self._lock:
                        self._pending[request_id] = future
                    self._send({"op": "run", "id": request_id}, [spec.fileno(), out.fileno(), err.fileno()])
                code = await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                self._kill(request_id)
                with contextlib.suppress(TimeoutError, SandboxDied):
                    await asyncio.wait_for(future, KILL_GRACE)
                raise TimeoutError(f"the command did not finish within {timeout} seconds") from None
            except asyncio.CancelledError:
                self._kill(request_id)  # the agent was cut off: its command goes with it
                raise
            finally:
                with self._lock:
                    self._pending.pop(request_id, None)
            out.seek(0)
            err.seek(0)
            return CommandResult(
                code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
            )

    async def stop(self) -> None:
        """Kill the sandbox's bwrap and wait for it; its PID namespace takes every process with it."""
        self._stopped = True
        proc, self._proc = self._proc, None
        if self._control is not None:
            self._control.close()
            self._control = None
        if proc is not None:
            _kill_group(proc.pid)
            await asyncio.to_thread(proc.wait)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)
            self._reader = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _send(self, header: dict[str, object], fds: list[int]) -> None:
        if self._died is not None:
            raise SandboxDied(self._died)
        try:
            assert self._control is not None
            socket.send_fds(self._control, [json.dumps(header).encode()], fds)
        except (OSError, AssertionError):
            # The supervisor is gone or stopped reading: the reader says why as soon as bwrap exits.
            raise SandboxDied(
                self._died or "the local sandbox died: its supervisor stopped taking commands"
            ) from None

    def _kill(self, request_id: int) -> None:
        with contextlib.suppress(SandboxDied):
            self._send({"op": "kill", "id": request_id}, [])

    def _read_answers(self, proc: subprocess.Popen[bytes]) -> None:
        """The reader thread: resolve each answered command, then say how the sandbox ended."""
        assert proc.stdout is not None
        for line in proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._pending.get(answer.get("id"))
            if future is not None:
                _resolve(future, result=int(answer["rc"]))
        code = proc.wait()
        proc.stdout.close()
        if self._stopped:
            return
        with self._lock:
            in_flight = " while a command ran" if self._pending else ""
            if code < 0:
                # A negative code is bwrap itself killed (an operator's kill, the OOM killer, a crash);
                # its --die-with-parent and PID namespace take the commands down with it, and whatever
                # they left half done is no state to grade. Never "timed out", never the command.
                self._died = (
                    f"the local sandbox died: its bwrap process was killed by {_signal_name(-code)} "
                    f"from outside the sandbox{in_flight}"
                )
            else:
                self._died = (
                    f"the local sandbox died: its supervisor exited with code {code}{in_flight}: "
                    f"{self._complaints()}"
                )
            pending = list(self._pending.values())
        for future in pending:
            _resolve(future, error=SandboxDied(self._died))

    def _complaints(self) -> str:
        if self._log is None:
            return "(no output)"
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").strip()
        return text[-1500:] or "(no output)"


def _resolve(future: asyncio.Future[int], result: int = 0, error: BaseException | None = None) -> None:
    """Settle `future` from the reader thread, on its own loop (unless it is done or its loop closed)."""

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop that awaited it has closed: nobody waits
        future.get_loop().call_soon_threadsafe(settle)


def _readline(stream: IO[bytes], timeout: float) -> bytes:
    """One line from a pipe, or b"" when none comes within `timeout` seconds or it closes first."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
