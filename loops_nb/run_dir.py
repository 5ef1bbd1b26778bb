"""A run's directory: run.json, steps.jsonl, rollouts.jsonl, checkpoints.jsonl, transcripts/, state/.

Nothing is lost and nothing is half-written: JSON files are replaced atomically, JSONL records are
appended whole and fsynced, and a resumed run first cuts every log back to its last checkpoint, so
no step is recorded twice. `checkpoints.jsonl` is the source of truth for resuming.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from loops_nb.errors import RunFailed, UserError

_NAME = re.compile(r"^[A-Za-z0-9_.@+-]{1,200}$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all (temp file in the same directory, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: object) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


class JsonlLog:
    """An append-only JSONL file whose every line is a whole record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._repaired = False
        path.parent.mkdir(parents=True, exist_ok=True)

    def _repair(self) -> None:
        """Drop a trailing partial line left by a crash mid-write, before this process first writes.

        Not when the log is opened: a process refused by the run lock opens the logs of a live run,
        whose last line may be one the live run is writing at that moment.
        """
        if self._repaired:
            return
        self._repaired = True
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with self.path.open("r+b") as f:
                f.truncate(cut)

    def append(self, record: Mapping[str, object]) -> None:
        self.extend([record])

    def extend(self, records: Sequence[Mapping[str, object]]) -> None:
        """Append records with one write and one fsync (a step's rollouts at once)."""
        if not records:
            return
        text = "".join(json.dumps(r, default=str, allow_nan=False) + "\n" for r in records)
        self._repair()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                # A last line without its newline is one a crash (or a live writer) left half-written.
                if line.strip() and line.endswith("\n"):
                    yield json.loads(line)

    def keep(self, predicate: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrite the log keeping only records for which `predicate(record)` holds; returns dropped count.

        Also cuts a half-written last line, even when no record is dropped: only the process that owns
        the run (holding its lock, resuming) calls this, and a torn tail left until its next append
        would outlive a kill before that append and break every strict JSONL reader meanwhile.
        """
        self._repair()
        records = list(self.records())
        kept = [r for r in records if predicate(r)]
        if len(kept) != len(records):
            atomic_write_text(self.path, "".join(json.dumps(r, default=str) + "\n" for r in kept))
        return len(records) - len(kept)


class RunJson(TypedDict, total=False):
    """run.json: what a run is, written when an attempt opens its Loops client (`RunDirectory.record_attempt`)."""

    recipe: str
    run_id: str
    """The first attempt's Loops run: it names the run's first checkpoints."""
    run_ids: list[str]
    """Every Loops client this directory opened, oldest first (a resume is a new one)."""
    previous_run_ids: list[str]
    """Written by older versions: the earlier ids, with the latest in ``run_id``."""
    model: str
    scope: str
    config_path: str
    config: dict[str, object]
    """The config as it validated (``model_dump`` in JSON form)."""
    renderer: dict[str, str | None] | None
    """The renderer the run resolved (`RendererChoice.record`)."""
    data: dict[str, object]
    """SFT's data summary (its plan's ``total_steps`` among them)."""
    started: float
    """The first attempt's start (seconds since the epoch)."""


@dataclass(frozen=True)
class Checkpoint:
    """A line of checkpoints.jsonl."""

    step: int
    """Optimizer steps applied when it was saved."""
    path: str
    """What `load_state_with_optimizer` takes."""
    sampler_path: str | None = None
    policy_version: int | None = None
    """RL: the policy version the state holds (the line's ``extra``)."""


class RunDirectory:
    """`<output_dir>/<run_name>/` and its files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), root)
            raise UserError(
                f"cannot create the run directory {root}: {blocker} is a file; set output.output_dir "
                "to a directory (or a path that does not exist yet)"
            ) from None
        except OSError as exc:
            raise UserError(f"cannot create the run directory {root}: {exc.strerror or exc}") from None
        self.steps = JsonlLog(root / "steps.jsonl")
        self.rollouts = JsonlLog(root / "rollouts.jsonl")
        self.checkpoint_log = JsonlLog(root / "checkpoints.jsonl")
        self.transcripts = root / "transcripts"
        self.state = root / "state"

    @classmethod
    def create(cls, output_dir: Path, run_name: str | None, config_stem: str) -> RunDirectory:
        if run_name is not None and not _NAME.match(run_name):
            raise UserError(f"output.run_name = {run_name!r}: use letters, digits and . _ @ + - only")
        name = run_name or f"{config_stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
        return cls(output_dir / name)

    @classmethod
    def existing(cls, path: str | os.PathLike[str]) -> RunDirectory:
        """A run directory that must exist already (one read back, not one a run creates)."""
        root = Path(path)
        if not root.is_dir():
            raise UserError(f"{root}: no such run directory")
        return cls(root)

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    def read_run_json(self) -> RunJson | None:
        """run.json, None before a run has written it; a UserError when it is not JSON."""
        try:
            data: RunJson = json.loads(self.run_json.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise UserError(f"{self.run_json}: not valid JSON ({exc})") from None
        return data

    def record_attempt(self, resumed: RunJson | None, client_run_id: str, record: RunJson) -> None:
        """Write run.json for an attempt that opened the Loops training client ``client_run_id`` (`RunJson` says
        what its keys keep); ``resumed`` is the run.json read before (None for a new run)."""
        before: RunJson = resumed or {}
        # Older run.json files kept the latest id in run_id and the earlier ones in previous_run_ids.
        earlier = before.get("run_ids") or [
            *before.get("previous_run_ids", []),
            *filter(None, [before.get("run_id")]),
        ]
        data: RunJson = {
            "run_id": before.get("run_id") or client_run_id,
            "run_ids": [*earlier, client_run_id],
        }
        atomic_write_json(
            self.run_json, {"recipe": None, **data, **record, "started": before.get("started", time.time())}
        )

    def finished(self, total_steps: int) -> Checkpoint | None:
        """The last checkpoint when it holds all ``total_steps`` steps and the sampler weights: the run is done,
        and a rerun has nothing to train (so it needs no Loops client). None otherwise."""
        last = self.last_checkpoint()
        if last is None or last.sampler_path is None or last.step < total_steps:
            return None
        return last

    def note_complete(self, checkpoint: Checkpoint, more: str) -> str:
        """Say (in run.log, and returned for the log) that a rerun found the run complete; ``more``: how to
        train on."""
        message = (
            f"{self.root} is already complete: {checkpoint.step} steps, sampler weights {checkpoint.sampler_path}; "
            f"nothing to train, so no Loops client was started ({more}, or use a new output.run_name)"
        )
        # The lock holder's first write, as a resumed run's would be: drop lines a crash left half-written.
        for jsonl in (self.steps, self.rollouts, self.checkpoint_log):
            jsonl._repair()
        self.note(message)
        return message

    def checkpoints(self) -> list[Checkpoint]:
        """Every line of checkpoints.jsonl, oldest first."""
        return [
            Checkpoint(
                int(line["step"]),
                str(line["path"]),
                line.get("sampler_path"),
                (line.get("extra") or {}).get("policy_version"),
            )
            for line in self.checkpoint_log.records()
        ]

    def last_checkpoint(self) -> Checkpoint | None:
        return next(reversed(self.checkpoints()), None)

    def record_checkpoint(self, checkpoint: Checkpoint) -> None:
        version = checkpoint.policy_version
        self.checkpoint_log.append(
            {
                "step": checkpoint.step,
                "path": checkpoint.path,
                "sampler_path": checkpoint.sampler_path,
                "extra": None if version is None else {"policy_version": version},
                "time": time.time(),
            }
        )

    def last_step_record(self) -> dict[str, Any]:
        """The last line of `steps.jsonl` ({} before the first step)."""
        return next(reversed(list(self.steps.records())), {})

    def record_failure(self, step: int, exc: BaseException) -> RunFailed:
        """The `RunFailed` for a fault at `step`, resuming from the last checkpoint; noted in `run.log`."""
        last = self.last_checkpoint()
        failure = RunFailed(str(self.root), step, last.step if last else 0, exc)
        trace = "".join(traceback.format_exception(exc)).rstrip("\n")
        self.note(f"failed: {failure}\n{trace}")
        return failure

    def note_failure(self, reason: str) -> None:
        """Note in `run.log` that a run which ran to its end failed (it trained nothing): `loops runs` says so."""
        self.note(f"failed: {reason}")

    def note(self, line: str) -> None:
        """Append ``line`` to `run.log`. The fault being noted may be the disk itself: failing to note it must
        not replace it."""
        with contextlib.suppress(OSError), (self.root / "run.log").open("a") as log_file:
            log_file.write(f"{line}\n")

    def rewind_to(self, step: int) -> None:
        """Forget every record past `step`: they will be redone from the checkpoint at `step`."""
        self.steps.keep(lambda r: r.get("step", 0) < step)
        self.rollouts.keep(lambda r: r.get("step", 0) < step)
        self.checkpoint_log.keep(lambda r: r.get("step", 0) <= step)

    def write_transcript(self, name: str, data: object) -> None:
        atomic_write_json(self.transcripts / f"{name}.json", data)
