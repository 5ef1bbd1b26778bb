"""Helpers the test files share: the `loops` command in a subprocess or in this process, JSONL logs, and an
example's own module loaded by path.

Importable from any test as `from helpers import ...`: pyproject.toml puts `tests/` and `tests/sft/` on
pytest's `pythonpath` (a child process does not inherit it: give one that imports test modules PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple


class CliResult(NamedTuple):
    """What one `loops ...` command did: its exit code and everything it printed (`code, out, err = ...`)."""

    returncode: int
    stdout: str
    stderr: str


def cli_command(*args: str | os.PathLike[str]) -> list[str]:
    """The argv that runs `loops ARGS...` with this interpreter (as the `loops` script would)."""
    return [sys.executable, "-m", "loops_nb.cli", *(str(a) for a in args)]


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(env or {})}


def run_cli(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> CliResult:
    """`loops ARGS...` in a subprocess, to the end; `env` is added to this process's environment."""
    done = subprocess.run(
        cli_command(*args), cwd=cwd, env=_environment(env), capture_output=True, text=True, timeout=timeout
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def start_cli(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """`loops ARGS...` started in a subprocess the caller waits on, kills or reads (for `serve`, or a run
    killed mid-way); `env` is added to this process's environment, the rest goes to `subprocess.Popen`."""
    return subprocess.Popen(cli_command(*args), cwd=cwd, env=_environment(env), **popen)


def run_cli_in_process(*args: str | os.PathLike[str]) -> CliResult:
    """`loops ARGS...` in this process (`loops_nb.cli.main`), writing to strict UTF-8 streams as a terminal
    would, so printing text that cannot be encoded fails the test."""
    from loops_nb.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return CliResult(code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())  # type: ignore[attr-defined]


def read_jsonl(path: str | os.PathLike[str], *, missing_ok: bool = False) -> list[Any]:
    """Every line of a JSONL file, parsed; a torn (half-written) line raises. `missing_ok`: no file is []."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def import_file(path: str | os.PathLike[str], name: str) -> ModuleType:
    """The Python file at `path` (an example's or a pattern's own module), loaded as a module named `name`.

    By path and under a name of its own, not through sys.path or sys.modules: several examples and patterns
    have a module of the same name (`agent`, `episode`), and the tests import more than one of them.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Done:
    """An SDK future that has already resolved to ``value`` (what scripted training clients return)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    async def result_async(self) -> Any:
        return self.value
