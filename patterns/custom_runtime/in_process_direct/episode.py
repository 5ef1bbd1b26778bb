"""The quickstart Episode: the model names a hidden board game once and the episode scores the reply.

    uv run loops run patterns/custom_runtime/in_process_direct/train_local.toml

One model call per attempt, graded here, no sandbox: the smallest custom runtime. Every attempt in a
group sees the same prompt; GRPO pushes probability towards the replies that name the hidden game,
so the mean reward climbs within a few steps. Deliberate simplifications: one task, a substring
match as the verifier.
"""

from __future__ import annotations

from loops_nb.episodes import Episode, Task
from loops_nb.llm.client import llm

PROMPT = "What is the most famous board game? Answer with its name only."


class HiddenGame(Episode):
    def __init__(self, answer: str = "monopoly", prompt: str = PROMPT) -> None:
        super().__init__(answer=answer, prompt=prompt)
        self.answer = answer.lower()
        self.prompt = prompt

    def tasks(self) -> list[Task]:
        return [Task(id=f"hidden-{self.answer}", data={"answer": self.answer, "prompt": self.prompt})]

    async def run(self, task: Task) -> float:
        reply = await llm().chat([{"role": "user", "content": task.data["prompt"]}])
        return 1.0 if task.data["answer"] in reply.content.lower() else 0.0
