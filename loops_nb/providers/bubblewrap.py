"""`BubblewrapSandbox`: a sandbox on this machine without Docker, built from bubblewrap (`bwrap`).

The host's filesystem is visible read-only; a per-sandbox host directory backs every writable path. One
`bwrap` per sandbox, from `start()` to `stop()`, holds its namespaces, and a supervisor inside it
(`sandbox_supervisor.py`) runs each command, so files and background processes persist across commands, as
in a container. Each command's environment is exactly the given variables, so the run's credentials never
reach a task. Its deliberate limits are in docs/reference/harbor.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import loops_nb.providers.sandbox_supervisor as sandbox_supervisor
from loops_nb.providers.sandbox_session import (
    CommandResult,
    SandboxDied,
    SandboxUnavailable,
    SupervisorSession,
)

BWRAP = "bwrap"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host entries never bound from the host: the sandbox gets its own /proc, /dev and /tmp.
_OWN_MOUNTS = {"proc", "dev", "tmp", "sys"}
# The supervisor runs from its source text, so no file of the package need be visible in the sandbox.
_SUPERVISOR_SOURCE = Path(sandbox_supervisor.__file__).read_text(encoding="utf-8")


def bwrap_path() -> str:
    """The `bwrap` executable, or a SandboxUnavailable saying how to install it."""
    found = shutil.which(BWRAP)
    if found is None:
        raise SandboxUnavailable(
            "the local sandbox needs bubblewrap: install it (`apt-get install bubblewrap`) "
            "or use a docker, blaxel or daytona provider"
        )
    return found


class BubblewrapSandbox:
    """One sandbox: a host directory tree behind its writable paths, and commands run inside it."""

    def __init__(
        self,
        root: Path,
        writable: Iterable[str],
        workdir: str = "/app",
        *,
        network: bool = True,
        hidden: Iterable[str] = (),
        host_binds: Mapping[str, Path] | None = None,
    ) -> None:
        self.root = root
        self.workdir = workdir
        self.network = network
        self.hidden = [str(PurePosixPath(h)) for h in hidden]
        # A writable sandbox path -> the host directory behind it. Explicit host binds (Harbor's
        # auto-mounted trial directories) win over a directory under the sandbox root.
        self.mounts: dict[str, Path] = {}
        for path in {*writable, workdir, "/tmp"}:
            clean = str(PurePosixPath("/") / path)
            self.mounts[clean] = root / "fs" / clean.lstrip("/")
        for target, source in (host_binds or {}).items():
            self.mounts[str(PurePosixPath("/") / target)] = Path(source)
        self._session = SupervisorSession()

    def create(self) -> None:
        for host in self.mounts.values():
            host.mkdir(parents=True, exist_ok=True)

    def remove(self) -> bool:
        """Delete the sandbox's host directory; True when it is gone."""
        return remove_tree(self.root)

    def check(self) -> None:
        """Raise SandboxDied when a host directory behind a writable path is gone.

        Without this, bwrap fails to bind it ("Can't find source path", exit code 1), which an agent may
        take for its command's failure; and a file upload would quietly recreate part of the tree.
        """
        for target, host in self.mounts.items():
            if not host.is_dir():
                raise SandboxDied(
                    f"the local sandbox died: its directory {host} (behind {target}) was removed from the "
                    "host while the trial ran"
                )

    def host_path(self, sandbox_path: str) -> Path:
        """The host path behind a sandbox path; only paths under a writable mount have one."""
        path = PurePosixPath("/") / sandbox_path
        best = max((t for t in self.mounts if path.is_relative_to(t)), key=len, default=None)
        if best is None:
            raise FileNotFoundError(
                f"{sandbox_path} is outside the local sandbox's writable paths ({', '.join(sorted(self.mounts))})"
            )
        return self.mounts[best] / path.relative_to(best)

    def argv(self, control_fd: int) -> list[str]:
        """The `bwrap` command line of the sandbox's supervisor, talking to the host on `control_fd`."""
        args = [bwrap_path(), "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        if not self.network:
            args.append("--unshare-net")
        targets = {PurePosixPath(t) for t in self.mounts if t != "/"}
        ancestors = {parent for t in targets for parent in t.parents if parent != PurePosixPath("/")}
        args += _host_tree(Path("/"), targets, ancestors)
        args += ["--dev", "/dev", "--proc", "/proc"]
        for hidden in self.hidden:
            args += ["--tmpfs", hidden]
        python, prefix = _interpreter()
        if any(prefix.is_relative_to(h) for h in self.hidden):
            args += ["--ro-bind", str(prefix), str(prefix)]  # only the interpreter, for the supervisor
        for target in sorted(self.mounts, key=lambda t: len(PurePosixPath(t).parts)):
            args += ["--dir", target, "--bind", str(self.mounts[target]), target]
        # The verifier's offline tools run this Python environment and loops_nb's own files: when a writable
        # path or a hidden one covers them (a checkout or venv under /tmp), they are bound back read-only.
        covers = [PurePosixPath(h) for h in self.hidden] + [PurePosixPath(t) for t in self.mounts if t != "/"]
        for needed in _runtime_paths():
            if any(needed.is_relative_to(c) for c in covers):
                args += ["--ro-bind", str(needed), str(needed)]
        # Root is bwrap's own tmpfs: make it read-only so a stray write fails loudly instead of vanishing.
        args += ["--remount-ro", "/", "--chdir", "/", "--clearenv"]
        return [*args, python, "-I", "-S", "-c", _SUPERVISOR_SOURCE, str(control_fd)]

    async def start(self) -> None:
        """Start the sandbox: one bwrap, whose namespaces every later command shares until `stop()`."""
        self.check()
        await self._session.start(self.argv)

    async def stop(self) -> None:
        """Kill every process in the sandbox (its PID namespace ends with bwrap). Files stay."""
        await self._session.stop()

    async def run(
        self,
        command: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run `bash -c command` in the sandbox (starting it if needed); a timeout raises TimeoutError.

        A timeout kills the command's process group; what it started in a session of its own (a tmux
        server) lives on until `stop()`. Raises SandboxDied when the sandbox's directory is gone, before
        or after the command, or when its bwrap was killed from outside.
        """
        self.check()
        variables = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", **(env or {})}
        result = await self._session.run(self.argv, command, cwd or self.workdir, variables, timeout)
        self.check()  # removed while the command ran: what it wrote went with the directory
        return result


def _host_tree(directory: Path, targets: set[PurePosixPath], ancestors: set[PurePosixPath]) -> list[str]:
    """bwrap arguments showing the host under `directory` read-only, with room for the writable targets.

    A target's own path is left to its bind; a directory on the way to a target is recreated (empty, on
    bwrap's tmpfs root) and its other entries are bound one by one, so `WORKDIR /usr/src/app` still
    sees the rest of /usr.
    """
    args: list[str] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return args
    for entry in entries:
        path = PurePosixPath(entry)
        if path in targets or (directory == Path("/") and entry.name in _OWN_MOUNTS):
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry), str(entry)]
        elif path in ancestors and entry.is_dir():
            args += ["--dir", str(entry), *_host_tree(entry, targets, ancestors)]
        elif entry.is_dir() or directory != Path("/"):  # a file only beside a target's directory
            args += ["--ro-bind", str(entry), str(entry)]
    return args


def remove_tree(path: Path) -> bool:
    """Delete a sandbox directory, also what a task made read-only; True when it is gone.

    A task running as this user may leave a directory without write permission (`chmod 555 dir`), and
    `rmtree` cannot empty it: open such directories up and try again, rather than report a removal that
    did not happen. Links are never followed, so nothing outside the directory changes mode.
    """
    shutil.rmtree(path, ignore_errors=True)
    if path.exists() and not path.is_symlink():
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
        for parent, dirs, _ in os.walk(path):  # top-down: each directory is opened before it is entered
            for name in dirs:
                child = os.path.join(parent, name)
                if not os.path.islink(child):
                    with contextlib.suppress(OSError):
                        os.chmod(child, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def _runtime_paths() -> list[PurePosixPath]:
    """This process's Python environment and the loops_nb package, as real paths."""
    package = Path(__file__).resolve().parents[1]
    return [PurePosixPath(os.path.realpath(sys.prefix)), PurePosixPath(package)]


def _interpreter() -> tuple[str, PurePosixPath]:
    """This Python's real interpreter (never a venv's link) and its installation prefix."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return executable, PurePosixPath(os.path.realpath(sys.base_prefix))
