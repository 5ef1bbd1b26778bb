"""The one-call Harbor agent: ask the model the task's instruction once and write the reply as the answer.

    uv run loops run patterns/harbor/in_process_direct/train_local.toml

The same agent as the custom-runtime quickstart, but as a Harbor `LoopsAgent`: Harbor starts a sandbox
for the task (../tasks/hidden_game), the agent writes its answer into it, and the task's own verifier
(tests/test.sh, never seen by the agent) writes the reward. Deliberate simplifications: one model call,
no tools; the sandbox is used only for the answer file and the verifier.
"""

from __future__ import annotations

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from loops_nb.harbor import LoopsAgent


class OneCallAgent(LoopsAgent):
    """Answers in one model call; `answer_file` is where the task's verifier looks."""

    def __init__(self, *args, answer_file: str = "/app/answer.txt", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.answer_file = answer_file

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        messages = [{"role": "user", "content": instruction.strip()}]
        reply = await self.llm.chat(messages)
        self.transcript += [*messages, reply.message]
        await self.write_file(environment, self.answer_file, reply.content + "\n")
