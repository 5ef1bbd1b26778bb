"""The verifiers environment: a uv environment of its own, built once per set of requirements and reused.

verifiers cannot share the kit's environment (it pins `mcp` and `openai` below what Harbor and the OpenAI
Agents SDK need), so each episode runs in a separate interpreter. docs/reference/verifiers.md, "The verifiers
environment: where and how it is built", has the commands, the cache, its key and why a half-built one is
never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from loops_nb.errors import UserError

CACHE_ENV = "LOOPS_NB_VERIFIERS_CACHE"
MARKER = "loops_nb_ready.json"


def default_cache_dir() -> Path:
    """`$LOOPS_NB_VERIFIERS_CACHE`, else `~/.cache/loops_nb/verifiers`."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "loops_nb" / "verifiers"


def find_uv() -> str:
    """The `uv` on PATH, or the one installed beside this interpreter."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        raise UserError(
            "the verifiers runtime builds its environment with uv, which is not on PATH: install it "
            "(`pip install uv`), or set runtime.options.python to an interpreter that has verifiers"
        )
    return found


@dataclass(frozen=True)
class VerifiersEnvironment:
    """A built (or given) interpreter that has verifiers and the environment's packages."""

    python: Path
    root: Path | None
    """The built environment's directory (None for an interpreter given by `runtime.options.python`)."""
    requirements: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentBuild:
    """What to build: verifiers and the environment's packages, for this Python."""

    requirements: tuple[str, ...]
    cache_dir: Path
    python_version: str = f"{sys.version_info.major}.{sys.version_info.minor}"

    @cached_property
    def key(self) -> str:
        """The requirements, the Python version, and each local directory's files (so an edited local
        environment is built afresh, not taken from the cache)."""
        local = {r: _tree_stamp(Path(r)) for r in self.requirements if Path(r).is_dir()}
        blob = json.dumps(
            {"requirements": list(self.requirements), "python": self.python_version, "local": local}
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def root(self) -> Path:
        return self.cache_dir / self.key

    def built(self) -> VerifiersEnvironment | None:
        """The environment, when a finished build is in the cache."""
        python = self.root / "bin" / "python"
        if (self.root / MARKER).is_file() and python.exists():
            return VerifiersEnvironment(python, self.root, self.requirements)
        return None

    async def ensure(self, timeout: float = 1800.0) -> VerifiersEnvironment:
        """The cached environment, built first when it is not there yet."""
        found = self.built()
        if found is not None:
            return found
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.cache_dir / f"{self.key}.lock"
        with lock_path.open("a") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            try:
                found = self.built()  # another process may have built it while this one waited
                if found is None:
                    found = await self._build(timeout)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return found

    async def _build(self, timeout: float) -> VerifiersEnvironment:
        uv = find_uv()
        tmp = self.cache_dir / f".{self.key}.{os.getpid()}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            await _uv(
                [uv, "venv", "--relocatable", "--quiet", "--python", sys.executable, str(tmp)],
                "create the verifiers environment",
                timeout,
            )
            await _uv(
                [
                    uv,
                    "pip",
                    "install",
                    "--quiet",
                    "--compile-bytecode",  # every episode's process imports verifiers: compiled once, here
                    "--python",
                    str(tmp / "bin" / "python"),
                    *self.requirements,
                ],
                f"install {' '.join(self.requirements)} into the verifiers environment",
                timeout,
            )
            marker = {"requirements": list(self.requirements), "python": self.python_version}
            (tmp / MARKER).write_text(json.dumps(marker, indent=1))
            if self.root.exists():  # an unfinished build left behind without a marker
                shutil.rmtree(self.root)
            os.rename(tmp, self.root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = self.built()
        if found is None:
            raise UserError(f"the verifiers environment at {self.root} was built but has no bin/python")
        return found


def _tree_stamp(root: Path) -> str:
    """A digest of a directory's files (path, size, modification time), hidden and build folders left out."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part in {"__pycache__", "build", "dist"} for part in rel.parts):
            continue
        if path.is_file():
            stat = path.stat()
            digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


async def _uv(argv: list[str], what: str, timeout: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        raise UserError(
            f"could not {what}: uv ran past runtime.options.build_timeout_seconds ({timeout:g}s)"
        ) from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise UserError(f"could not {what}: {_reason(err.decode(errors='replace'))}")


def _reason(stderr: str) -> str:
    """uv's error in one line: its `error:` / `×` line and what follows it, whitespace folded."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith(("error:", "×")):
            return " ".join(" ".join(lines[i : i + 4]).split())[:400]
    return " ".join(" ".join(lines[-3:]).split())[:400] or "uv failed without saying why"


async def verifiers_environment(
    requirements: list[str], *, python: str | None, cache_dir: str | None, timeout: float
) -> VerifiersEnvironment:
    """The interpreter episodes run in: `python` as given, else the cached build of `requirements`."""
    if python is not None:
        path = Path(python).expanduser()
        resolved = shutil.which(str(path)) if not path.exists() else str(path)
        if resolved is None:
            raise UserError(f"runtime.options.python = {python!r}: no such interpreter")
        return VerifiersEnvironment(Path(resolved), None)
    cache = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()).resolve()
    return await EnvironmentBuild(tuple(requirements), cache).ensure(timeout)
