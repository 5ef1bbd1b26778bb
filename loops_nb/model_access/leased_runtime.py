"""`LeasedRuntime`: gives every attempt of a runtime a gateway lease while it runs, and revokes it after.

Each attempt's services carry `model_base_url` and `model_api_key` (its lease), which `model_env` turns into
the `OPENAI_BASE_URL` / `OPENAI_API_KEY` an agent program gets. The lease is revoked when the attempt returns,
raises or is cancelled, so a straggling agent cannot add tokens later; its requests still sampling are
cancelled, and a reply its agent never got is withdrawn (delivery.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from loops_nb.llm.chat_messages import ChatMessage
from loops_nb.llm.client import ContextTooLong
from loops_nb.model_access.agent_env import leased_env, passing_env
from loops_nb.model_access.delivery import settle_lease
from loops_nb.model_access.gateway import ModelGateway
from loops_nb.model_access.mode import ModelAccessMode
from loops_nb.runtime import AgentTimeLimit, Attempt, Evidence, RolloutRuntime, RunContext, Task

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer


class LeasedRuntime(RolloutRuntime):
    """A runtime whose attempts reach the model through `gateway` with a per-attempt lease."""

    model_access = ModelAccessMode.OPENAI_HTTP

    def __init__(self, inner: RolloutRuntime, gateway: ModelGateway, agent_env: Iterable[str] = ()) -> None:
        self.inner = inner
        self.gateway = gateway
        self.agent_env = tuple(agent_env)
        """`[runtime] agent_env`: variables the attempts' agent programs inherit (agent_env.py)."""

    async def tasks(self) -> Sequence[Task]:
        return await self.inner.tasks()

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        lease = self.gateway.issue(attempt.id, attempt.services.llm)
        attempt.services.model_base_url = self.gateway.url
        attempt.services.model_api_key = lease.key
        try:
            with leased_env(attempt), passing_env(self.agent_env):
                evidence = await self.inner.run_attempt(attempt)
        finally:
            self.gateway.revoke(lease.key)
            # Stop its requests still sampling, and learn which replies reached the agent: only those
            # stay in the capture the attempt trains on.
            await settle_lease(lease)
        if lease.truncated is not None and evidence.discarded is None:
            # The agent saw a context_length_exceeded error; in-process this discards as truncated too.
            raise ContextTooLong(lease.truncated)
        return evidence

    async def close(self) -> None:
        await self.inner.close()

    def bind(self, context: RunContext) -> None:
        self.inner.bind(context)

    async def preflight(self) -> list[str]:
        return await self.inner.preflight()

    async def check_lines(self, renderer: Renderer | None) -> tuple[list[str], list[str]]:
        return await self.inner.check_lines(renderer)

    def prompt_messages(self, task: Task) -> list[ChatMessage] | None:
        return self.inner.prompt_messages(task)

    async def agent_time_limits(self) -> Sequence[AgentTimeLimit]:
        return await self.inner.agent_time_limits()
