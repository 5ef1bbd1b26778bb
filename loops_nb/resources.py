"""The resource registry and its journal: what a run created, written down before it exists.

Sandboxes, samplers and deployments cost money while they live, and a crashed run cannot delete what it
created: `loops cleanup` releases what the journal still lists as live (docs/reference/resources.md).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from loops_nb.errors import UserError


@dataclass
class ResourceEntry:
    key: str
    """Journal key, unique within the run."""
    provider: str
    """The `[providers.<name>]` adapter that created it."""
    kind: str
    """sandbox, sampler, deployment, process, ..."""
    provider_id: str | None = None
    """The provider's own id, once it is known."""
    status: str = "intent"
    """intent -> created -> released (or failed)."""
    detail: dict[str, Any] = field(default_factory=dict)


class ResourceJournal:
    """An append-only JSONL journal of resource events, fsynced line by line."""

    _open: ClassVar[dict[Path, ResourceJournal]] = {}
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def at(cls, path: Path | str) -> ResourceJournal:
        """The process's one journal object for `path`, so every writer shares its lock."""
        key = Path(path).resolve()
        with cls._open_lock:
            journal = cls._open.get(key)
            if journal is None:
                journal = cls._open[key] = cls(key)
            return journal

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)

    def _append(self, event: dict[str, Any]) -> None:
        line = (json.dumps({**event, "time": time.time()}, default=str) + "\n").encode()
        with self._lock, self.path.open("a+b") as f:
            if f.seek(0, os.SEEK_END):
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    # A line cut by a crash: end it, or this event would join it and be lost with it.
                    line = b"\n" + line
            f.write(line)  # append mode: always at the end, whatever was read
            f.flush()
            os.fsync(f.fileno())

    def intent(self, provider: str, kind: str, **detail: object) -> ResourceEntry:
        entry = ResourceEntry(
            key=f"{kind}-{uuid.uuid4().hex[:12]}", provider=provider, kind=kind, detail=detail
        )
        self._append(
            {"event": "intent", "key": entry.key, "provider": provider, "kind": kind, "detail": detail}
        )
        return entry

    def created(self, entry: ResourceEntry, provider_id: str, **detail: object) -> None:
        entry.provider_id, entry.status = provider_id, "created"
        entry.detail.update(detail)
        self._append({"event": "created", "key": entry.key, "provider_id": provider_id, "detail": detail})

    def released(self, entry: ResourceEntry, status: str = "released") -> None:
        entry.status = status
        self._append({"event": status, "key": entry.key})

    def entries(self) -> Iterator[ResourceEntry]:
        """The journal folded into one entry per resource, in creation order."""
        found: dict[str, ResourceEntry] = {}
        if not self.path.exists():
            return iter(())
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash: the resource it named is in an earlier line or never existed
            key = event.get("key")
            if event.get("event") == "intent":
                found[key] = ResourceEntry(
                    key, event["provider"], event["kind"], detail=event.get("detail") or {}
                )
            elif key in found:
                entry = found[key]
                if event["event"] == "created":
                    entry.provider_id, entry.status = event.get("provider_id"), "created"
                    entry.detail.update(event.get("detail") or {})
                else:
                    entry.status = event["event"]
        return iter(found.values())

    def live(self) -> list[ResourceEntry]:
        """Resources that may still exist: created (or only intended) and not released."""
        return [e for e in self.entries() if e.status in ("intent", "created")]


class ResourceRegistry:
    """How a runtime creates and releases what costs money, journalled: `attempt.services.resources`."""

    def __init__(self, journal: ResourceJournal) -> None:
        self.journal = journal

    async def create(
        self, provider: str, kind: str, make: Callable[[], Awaitable[tuple[str, Any]]], **detail: object
    ) -> tuple[ResourceEntry, Any]:
        """Journal the intent, then `make()` -> (provider id, handle); a failure is journalled too."""
        entry = self.journal.intent(provider, kind, **detail)
        try:
            provider_id, handle = await make()
        except BaseException:
            self.journal.released(entry, "failed")
            raise
        self.journal.created(entry, provider_id)
        return entry, handle

    def released(self, entry: ResourceEntry) -> None:
        self.journal.released(entry)


class RunLock:
    """An exclusive lock on a run's state directory, held while the run lives. The OS drops a `flock` when its
    process dies, however it dies, so a lock that can be taken means no process is using the run
    (docs/reference/resources.md#the-run-lock: what it refuses)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "run.lock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    @classmethod
    def claim(cls, run_root: Path) -> RunLock:
        """The held lock of the run at `run_root`, or a UserError naming the process that holds it."""
        lock = cls(Path(run_root) / "state")
        if not lock.acquire():
            raise UserError(
                f"run directory {run_root} is in use by process {lock.holder()}: wait for it, or stop it"
            )
        return lock

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
