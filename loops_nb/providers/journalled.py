"""`JournalledSandbox`: the journal bookkeeping a Harbor environment does around its own start and stop.

Harbor builds environments by import path, with JSON keyword arguments; the run passes the journal's
path as `loops_journal` (a field of the environment's options model). The environment journals `intent`
before it asks its backend for a sandbox, `created` with the backend's id once it exists, and `released`
after it is deleted, so a crash at any point leaves a journal line `loops cleanup` can act on.
"""

from __future__ import annotations

from functools import cached_property

from loops_nb.resources import ResourceEntry, ResourceJournal


class JournalledSandbox:
    """Mixed into a Harbor environment class; `provider` names the `[providers.<name>]` adapter type."""

    provider: str = ""
    _journal_entry: ResourceEntry | None = None

    @cached_property
    def _journal(self) -> ResourceJournal | None:
        # Harbor sets `options` (its options model, parsed from the kwargs) in the environment's __init__.
        path = getattr(getattr(self, "options", None), "loops_journal", None)
        return ResourceJournal.at(path) if path else None

    def _journal_intent(self, **detail: object) -> None:
        if self._journal is not None:
            self._journal_entry = self._journal.intent(self.provider, "sandbox", **detail)

    def _journal_created(self, provider_id: str, **detail: object) -> None:
        if self._journal is not None and self._journal_entry is not None:
            self._journal.created(self._journal_entry, provider_id, **detail)

    def _journal_released(self, status: str = "released") -> None:
        if self._journal is not None and self._journal_entry is not None:
            self._journal.released(self._journal_entry, status)
            self._journal_entry = None

    async def stop(self, delete: bool) -> None:
        """The Harbor environment's own stop, then `released` when it deleted the sandbox."""
        await super().stop(delete)  # type: ignore[misc]  # the Harbor environment this is mixed into
        if delete:
            self._journal_released()
