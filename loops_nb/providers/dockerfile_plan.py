"""Reading a Harbor task's `environment/Dockerfile` without building it: what the local sandbox replays
(`WORKDIR`, `ENV`, `COPY`/`ADD` from `environment/`), and what it cannot (`ENTRYPOINT`, every line that
needs a build).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

_HARMLESS_ENTRYPOINTS = {"sh", "bash", "dash", "tini", "dumb-init", "env"}
"""Entrypoints that only start the command they are given: a shell or an init that reaps children."""


@dataclass
class DockerfilePlan:
    """What the local sandbox takes from a task's Dockerfile."""

    workdir: str | None = None
    """The last WORKDIR: the task's working directory unless task.toml sets one."""
    workdirs: list[str] = field(default_factory=list)
    """Every WORKDIR: each is writable in the sandbox, as in an image where it was created."""
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(source relative to environment/, absolute destination in the sandbox)."""
    needs_build: list[str] = field(default_factory=list)
    """The lines that need an image build, as `line N: TEXT`."""
    entrypoint: str | None = None
    """The ENTRYPOINT that runs before the task's commands, as `line N: TEXT`, unless it only starts them
    (a shell, tini, dumb-init). Harbor replaces CMD on every provider (`sleep infinity`), never ENTRYPOINT."""


def read_dockerfile(path: Path) -> DockerfilePlan:
    plan = DockerfilePlan()
    if not path.is_file():
        return plan
    for number, line in logical_lines(path.read_text(encoding="utf-8").splitlines()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            plan.entrypoint = None  # a new stage starts from its base image's entrypoint, not this one
        if keyword in ("FROM", "LABEL", "EXPOSE", "CMD", "USER", "ARG", "SHELL", "HEALTHCHECK", "STOPSIGNAL"):
            continue  # the host is the image; these change nothing a task's commands can see
        if keyword == "ENTRYPOINT":
            plan.entrypoint = None if _starts_only_its_command(rest) else f"line {number}: {line[:120]}"
        elif keyword == "WORKDIR":
            plan.workdir = str(PurePosixPath(plan.workdir or "/") / rest)
            plan.workdirs.append(plan.workdir)
        elif keyword == "ENV":
            plan.env.update(_env_pairs(rest))
        elif keyword in ("COPY", "ADD") and not rest.startswith("--from") and "://" not in rest:
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            *sources, dest = parts
            # A relative destination is relative to the WORKDIR in force at this line, as Docker does.
            absolute = dest if dest.startswith("/") else str(PurePosixPath(plan.workdir or "/") / dest)
            if dest.endswith("/") and not absolute.endswith("/"):
                absolute += "/"
            for source in sources:
                plan.copies.append((source, absolute))
        else:
            plan.needs_build.append(f"line {number}: {line[:120]}")
    return plan


def logical_lines(lines: Iterable[str]) -> list[tuple[int, str]]:
    """(first line number, text) of each instruction or shell command: `\\` continuations joined, comments and
    blank lines dropped (a comment or blank line ends a continued one)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(lines, 1):
        line = "" if raw.lstrip().startswith("#") else raw.strip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        if joined := (pending + line).strip():
            out.append((start, joined))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _starts_only_its_command(rest: str) -> bool:
    """Whether an ENTRYPOINT is a shell or init that just runs the command Harbor gives it."""
    try:
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    except ValueError:
        return False
    if not isinstance(words, list) or not words:
        return True  # `ENTRYPOINT []` clears the base image's entrypoint
    program = PurePosixPath(str(words[0])).name
    flags = [str(w) for w in words[1:]]
    return program in _HARMLESS_ENTRYPOINTS and all(w.startswith("-") for w in flags)


def _env_pairs(text: str) -> dict[str, str]:
    parts = shlex.split(text)
    if parts and "=" not in parts[0]:  # legacy `ENV KEY value with spaces`
        return {parts[0]: " ".join(parts[1:])}
    return dict(part.split("=", 1) for part in parts if "=" in part)
