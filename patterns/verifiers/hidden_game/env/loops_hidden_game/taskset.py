"""Tasks and rewards: the model names a hidden board game; the reward is a substring match.

Mirrors patterns/custom_runtime/in_process_direct (same prompt, same answer, same verifier), so the
verifiers pattern's reward curve compares with the quickstart's. A second reward, `short_answer`, has weight 0
unless the config sets one (verifiers' `task.rewards.<name>.weight`). `tool = true` is the tool-use variant:
the prompt asks the model to look the game up with the `lookup_game` tool first.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf
from pydantic import Field

PROMPT = "What is the most famous board game? Answer with its name only."
SHORT_WORDS = 4
TOOL_PROMPT = (
    "Which board game is hidden today? Call the lookup_game tool, then answer with the game's name only."
)


class HiddenGameConfig(vf.TasksetConfig):
    answer: str = "monopoly"
    """The hidden game; a reply that contains it (case-insensitive) earns reward 1."""
    prompt: str = PROMPT
    num_tasks: int = 1
    """How many (identical-prompt) tasks to list; ids are `hidden-<answer>-<i>`."""
    tool: bool = False
    """The tool-use variant: tasks carry one tool, `lookup_game`, that returns the answer."""


class HiddenGameData(vf.TaskData):
    answer: str
    tools: list[str] = Field(default_factory=list)
    """Names of the harness-side tools this task offers (see harness.TOOLS)."""


class HiddenGameTask(vf.Task[HiddenGameData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def names_game(self, task: HiddenGameData, trace: vf.Trace) -> float:
        """1 when the last assistant reply names the hidden game."""
        return 1.0 if task.answer.lower() in _last_reply(trace).lower() else 0.0

    @vf.reward(weight=0.0)
    async def short_answer(self, trace: vf.Trace) -> float:
        """1 when the last reply is a name only (at most `SHORT_WORDS` words), as the prompt asks. Weight 0
        unless the config gives it one (`task.rewards.short_answer.weight`): a format-shaped reward that
        SmolLM2-135M, whose sampled replies rarely name the game, can climb from its first step."""
        words = _last_reply(trace).split()
        return 1.0 if 0 < len(words) <= SHORT_WORDS else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(_last_reply(trace)))


def _last_reply(trace: vf.Trace) -> str:
    for message in reversed(trace.messages):
        if message.role == "assistant":
            content = message.content
            if isinstance(content, str):
                return content
            if content:
                return " ".join(getattr(part, "text", "") or "" for part in content)
    return ""


class HiddenGameTaskset(vf.Taskset[HiddenGameTask, HiddenGameConfig]):
    def load(self) -> Iterator[HiddenGameTask]:
        answer = self.config.answer.lower()
        prompt = TOOL_PROMPT if self.config.tool and self.config.prompt == PROMPT else self.config.prompt
        for i in range(self.config.num_tasks):
            yield HiddenGameTask(
                HiddenGameData(
                    id=f"hidden-{answer}-{i}",
                    prompt=[vf.UserMessage(content=prompt)],
                    answer=answer,
                    tools=["lookup_game"] if self.config.tool else [],
                ),
                self.config.task,
            )
