"""The one long-lived process inside a local sandbox: it starts every command the host sends it.

It runs as `python -I -S -c SOURCE FD` under bwrap, so it imports nothing but the standard library (the
installed package may be under a hidden path, and the sandbox's cleared environment has no venv). FD is
a SOCK_SEQPACKET socket to the host; each message is one JSON header with file descriptors attached:

- `{"op": "run", "id": N}` + [spec, stdout, stderr]: `spec` is a file holding
  `{"command", "cwd", "env"}`; the command's output goes straight into the host's two files, so no
  output size ever passes through here and a background process holding them open delays nothing.
- `{"op": "kill", "id": N}`: SIGKILL the command's process group (its timeout). What the command put in
  a session of its own (a tmux server, `setsid`) lives on until the sandbox stops.

Answers are JSON lines on stdout: `{"ready": true}` once, then `{"id": N, "rc": CODE}` as each command
ends (a command killed by signal S answers 128 + S, as a shell reports it). The host closing the socket
ends this process; bwrap's PID namespace then takes every process of the sandbox with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

_lock = threading.Lock()
_running: dict[int, subprocess.Popen[bytes]] = {}
_killed: dict[int, bool] = {}


def _answer(message: dict[str, object]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def _wait(request_id: int, proc: subprocess.Popen[bytes]) -> None:
    code = proc.wait()
    with _lock:
        _running.pop(request_id, None)
        killed = _killed.pop(request_id, False)
    if killed:
        _wait_for_group(proc.pid)
    _answer({"id": request_id, "rc": 128 - code if code < 0 else code})


def _wait_for_group(pgid: int, limit: float = 5.0) -> None:
    """Until every process of a killed command's group is gone (its orphans are reaped by bwrap's init),
    so the host's timeout returns with nothing of the command left running."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _run(request_id: int, fds: list[int]) -> None:
    spec_fd, out_fd, err_fd = fds
    with os.fdopen(spec_fd, "rb") as spec_file:
        spec = json.loads(spec_file.read())
    try:
        proc = subprocess.Popen(
            ["bash", "-c", spec["command"]],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            start_new_session=True,  # its own process group: a timeout kills all of it, and only it
        )
    except OSError as exc:  # a missing cwd, or no bash: say so as a shell would, not as a crash here
        os.write(err_fd, f"loops sandbox: cannot run the command in {spec['cwd']}: {exc.strerror}\n".encode())
        _answer({"id": request_id, "rc": 127 if exc.filename == "bash" else 1})
        return
    finally:
        os.close(out_fd)
        os.close(err_fd)
    with _lock:
        _running[request_id] = proc
    threading.Thread(target=_wait, args=(request_id, proc), daemon=True).start()


def _kill(request_id: int) -> None:
    with _lock:
        proc = _running.get(request_id)
        if proc is not None:  # still unreaped, so its process group cannot have been reused
            _killed[request_id] = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    _answer({"ready": True})
    while True:
        data, fds, _, _ = socket.recv_fds(control, 65536, 3)
        if not data:
            return  # the host hung up: the sandbox stops
        request = json.loads(data)
        if request["op"] == "run" and len(fds) == 3:
            _run(int(request["id"]), fds)
        else:
            for fd in fds:
                os.close(fd)
            if request["op"] == "kill":
                _kill(int(request["id"]))


if __name__ == "__main__":
    main()
