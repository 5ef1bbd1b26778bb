"""`loops cleanup`: release what a crashed run's resource journal lists as still alive
(docs/reference/resources.md#loops-cleanup).

Each provider adapter releases the rest; what it could not release stays live in the journal, so running
cleanup again retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loops_nb.errors import UserError
from loops_nb.providers.adapters import ADAPTERS, ProviderAdapter, provider_adapter
from loops_nb.resources import ResourceEntry, ResourceJournal, RunLock

JOURNAL_NAME = "journal.jsonl"


@dataclass
class CleanupReport:
    released: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    """Dry run: what would be released."""

    @property
    def ok(self) -> bool:
        return not self.failed

    def describe(self) -> list[str]:
        lines = [f"released: {line}" for line in self.released]
        lines += [f"would release: {line}" for line in self.pending]
        lines += [f"failed: {line}" for line in self.failed]
        if not lines:
            lines.append("nothing to release: every journalled resource is released")
        return lines


def journal_path(state_dir: Path) -> Path:
    path = Path(state_dir)
    if path.name == JOURNAL_NAME:
        return path
    journal = path / JOURNAL_NAME
    if not journal.is_file():
        hint = " (pass the run's state directory: runs/<run-dir>/state)" if (path / "state").is_dir() else ""
        raise UserError(f"--state-dir {state_dir}: no {JOURNAL_NAME} there{hint}")
    return journal


def adapter_for(entry: ResourceEntry, providers: Mapping[str, Any]) -> ProviderAdapter:
    """The adapter that releases an entry: the config's table of that type, else the type's defaults."""
    for name, config in providers.items():
        if getattr(config, "type", None) == entry.provider:
            return provider_adapter(name, dict(providers))
    if entry.provider in ADAPTERS:
        return provider_adapter(entry.provider, {})
    raise UserError(f"journal entry {entry.key}: unknown provider {entry.provider!r}")


def _label(entry: ResourceEntry) -> str:
    detail = entry.detail
    ident = entry.provider_id or detail.get("name") or detail.get("path") or detail.get("session")
    return f"{entry.provider} {entry.kind} {ident} ({entry.key}, {entry.status})"


async def cleanup(
    state_dir: Path, providers: Mapping[str, Any], *, dry_run: bool = False, force: bool = False
) -> CleanupReport:
    path = journal_path(state_dir)
    lock = RunLock(path.parent)
    if not force and not dry_run and not lock.acquire():
        raise UserError(
            f"the run using {path.parent} is still running (process {lock.holder()}): stop it first, "
            "or pass --force to release its resources under it"
        )
    report = CleanupReport()
    try:
        journal = ResourceJournal.at(path)
        for entry in journal.live():
            label = _label(entry)
            if dry_run:
                report.pending.append(label)
                continue
            try:
                done = await adapter_for(entry, providers).release(entry)
            except Exception as exc:  # one failure must not stop the rest; it stays live for a retry
                kind = "" if isinstance(exc, UserError) else f"{type(exc).__name__}: "
                report.failed.append(f"{label}: {kind}{exc}")
                continue
            journal.released(entry)
            report.released.append(f"{label}: {done}")
    finally:
        lock.release()
    return report
