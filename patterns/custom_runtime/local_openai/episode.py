"""The quickstart with the agent as its own program: one process per attempt, talking OpenAI HTTP.

    uv run loops run patterns/custom_runtime/local_openai/train_local.toml

`model_access = ModelAccessMode.OPENAI_HTTP` makes the run start its model gateway and give every
attempt a lease. `run_agent_program` launches the agent (`agent.py`) with PATH, HOME, the locale and
what `[runtime] agent_env` names, plus `OPENAI_BASE_URL` (the gateway) and `OPENAI_API_KEY` (the lease
key, valid only while this attempt runs; the run revokes it when `run_attempt` returns), and, where
bubblewrap works, in a PID namespace of its own, so it reads neither the run's secrets nor another
attempt's lease. Its stdout is scored like the quickstart's reply,
and the tokens it sampled through the gateway train exactly as an in-process agent's would. Swap
`agent.py` for any program (another language, a framework) that speaks OpenAI chat completions.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from loops_nb.model_access import ModelAccessMode, run_agent_program
from loops_nb.runtime import Attempt, Evidence, Task

AGENT = Path(__file__).with_name("agent.py")
PROMPT = "What is the most famous board game? Answer with its name only."


class LocalOpenAIAgent:
    """A RolloutRuntime: each attempt runs `agent.py` as a subprocess and scores what it prints."""

    model_access = ModelAccessMode.OPENAI_HTTP

    def __init__(self, answer: str = "monopoly", prompt: str = PROMPT, agent_timeout: float = 120.0) -> None:
        self.answer = answer.lower()
        self.prompt = prompt
        self.agent_timeout = agent_timeout

    async def tasks(self) -> Sequence[Task]:
        return [Task(id=f"hidden-{self.answer}", data={"answer": self.answer, "prompt": self.prompt})]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        try:
            done = await run_agent_program(
                [sys.executable, str(AGENT), attempt.task.data["prompt"]], attempt, timeout=self.agent_timeout
            )
        except TimeoutError:
            return Evidence.discard("timeout", f"the agent ran over {self.agent_timeout:g} s")
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace")[-2000:]
            return Evidence.discard("error", f"the agent exited {done.returncode}: {tail}")
        out = done.stdout
        answer = out.decode(errors="replace").strip()
        reward = 1.0 if attempt.task.data["answer"] in answer.lower() else 0.0
        transcript = [
            {"role": "user", "content": attempt.task.data["prompt"]},
            {"role": "assistant", "content": answer},
        ]
        return Evidence(reward=reward, transcript=transcript)

    async def close(self) -> None:
        pass
