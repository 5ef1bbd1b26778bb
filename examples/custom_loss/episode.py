"""The hidden-game Episode (as in patterns/custom_runtime/in_process_direct), trained with a custom loss.

One model call per attempt, graded here: the model names a board game, the reward is 1 when it is the
hidden one. The example's point is the loss (`kl_loss.py`), not the task.
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
