"""The `daytona` provider's Harbor environment: Harbor's Daytona sandboxes, journalled.

`JournalledDaytonaEnvironment` is Harbor's `DaytonaEnvironment` plus the run's journal: `intent` (with
Harbor's session id, which Daytona also carries as the `harbor.session_id` label) before the sandbox
is requested, `created` with the sandbox id, `released` once Harbor deleted it. Needs the
`harbor-daytona` extra.
"""

from __future__ import annotations

from harbor.environments.daytona.environment import DaytonaEnvironment, DaytonaOptions

from loops_nb.providers.journalled import JournalledSandbox


class JournalledDaytonaOptions(DaytonaOptions):
    loops_journal: str | None = None
    """The run's resource journal (set by loops_nb)."""


class JournalledDaytonaEnvironment(JournalledSandbox, DaytonaEnvironment):
    options_model = JournalledDaytonaOptions
    provider = "daytona"

    async def start(self, force_build: bool) -> None:
        self._journal_intent(session=self.session_id, task=self.environment_name)
        try:
            await super().start(force_build)
        finally:
            sandbox = getattr(self, "_sandbox", None)
            if sandbox is not None:
                self._journal_created(sandbox.id, session=self.session_id)
