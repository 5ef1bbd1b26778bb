"""The `blaxel` provider's Harbor environment: Harbor's Blaxel sandboxes, journalled.

Blaxel names a sandbox before creating it, so the `intent` line already carries the name `loops
cleanup` deletes by; `created` and `released` follow Harbor's start and stop. Needs the
`harbor-blaxel` extra.
"""

from __future__ import annotations

from harbor.environments.blaxel import BlaxelEnvironment, BlaxelOptions

from loops_nb.providers.journalled import JournalledSandbox


class JournalledBlaxelOptions(BlaxelOptions):
    loops_journal: str | None = None
    """The run's resource journal (set by loops_nb)."""


class JournalledBlaxelEnvironment(JournalledSandbox, BlaxelEnvironment):
    options_model = JournalledBlaxelOptions
    provider = "blaxel"

    async def start(self, force_build: bool) -> None:
        name = self._require_sandbox_name()
        self._journal_intent(session=self.session_id, task=self.environment_name, name=name)
        await super().start(force_build)
        self._journal_created(name)
