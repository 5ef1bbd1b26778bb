"""`LoopsTerminus2`: Harbor's own Terminus-2 agent, trained by loops_nb through the run's model gateway.

Per trial it builds the installed Harbor's `Terminus2` with LiteLLM pointed at the attempt's gateway lease,
so every completion it gets is sampled by the policy and captured like any agent program's. It needs
`model_access = "openai_http"` and tmux in a sandbox where a background process outlives its command.
`agent_kwargs` are Terminus-2's own (docs/reference/harbor.md), with two defaults changed:
`record_terminal_session` false (asciinema is rarely installed, and offline cannot be) and
`suppress_max_turns_warning` true (a run's `max_turns` is its config's choice, not news on every attempt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harbor.agents import terminus_2
from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from loops_nb.harbor.agent import LoopsAgent
from loops_nb.llm.chat_messages import ChatMessage

if TYPE_CHECKING:
    from harbor.models.trajectories.step import Step

    from loops_nb.llm.capture import ModelCall

_SHARED = ("logs_dir", "logger", "mcp_servers", "skills_dir", "extra_env", "environment_logs_dir")
"""Harbor's keywords for every agent: both this wrapper and the Terminus-2 inside it get them."""


class LoopsTerminus2(LoopsAgent):
    """Harbor's Terminus-2 on the attempt's gateway lease; `agent_kwargs` go to Terminus-2."""

    options_model = Terminus2.options_model
    """Terminus-2's options, so `loops check` refuses a misspelled `agent_kwargs` key by name."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        record_terminal_session: bool = False,
        **kwargs: Any,
    ) -> None:
        loops = {k: kwargs.pop(k) for k in ("loops_attempt", "loops_config_dir") if k in kwargs}
        super().__init__(logs_dir, model_name, **loops, **{k: kwargs[k] for k in _SHARED if k in kwargs})
        # Harbor warns on every attempt that max_turns limits the episode; in a training run the limit is
        # the config's own choice (`agent_kwargs.max_turns`), so one warning per attempt is noise.
        kwargs.setdefault("suppress_max_turns_warning", True)
        self._terminus_kwargs = {**kwargs, "record_terminal_session": record_terminal_session}
        self._served_name = model_name or "policy"
        self.terminus: Terminus2 | None = None
        """The Terminus-2 of this trial, made in `setup()` once the attempt's lease is known."""

    @staticmethod
    def name() -> str:
        return "loops-terminus-2"

    @classmethod
    def expected_calls(cls, agent_kwargs: Mapping[str, object]) -> tuple[int, str]:
        turns = agent_kwargs.get("max_turns")
        if isinstance(turns, int) and turns > 0:
            return turns, f"agent_kwargs.max_turns = {turns}"
        return 2, "Terminus-2's least: an answer and its confirmation"

    @classmethod
    def first_prompt(cls, instruction: str, agent_kwargs: Mapping[str, object]) -> str:
        parser = agent_kwargs.get("parser_name") or "json"
        template = Path(terminus_2.__file__).parent / "templates" / f"terminus-{parser}-plain.txt"
        try:
            return template.read_text().format(instruction=instruction, terminal_state="")
        except (OSError, KeyError, IndexError):
            return instruction

    async def setup(self, environment: BaseEnvironment) -> None:
        services = self.attempt.services if self.attempt is not None else None
        if services is None or not services.model_base_url:
            raise RuntimeError(
                "LoopsTerminus2 calls the model over HTTP: it runs only inside a loops_nb run with "
                '[runtime.options] model_access = "openai_http"'
            )
        llm_kwargs = {
            **(self._terminus_kwargs.pop("llm_kwargs", None) or {}),
            "api_key": services.model_api_key,
        }
        self.terminus = Terminus2(
            logs_dir=self.logs_dir,
            # `openai/` makes LiteLLM speak Chat Completions to api_base; the gateway serves the policy
            # whatever the model is named, and the lease key says whose attempt it is.
            model_name=f"openai/{self._served_name}",
            api_base=services.model_base_url,
            llm_kwargs=llm_kwargs,
            **self._terminus_kwargs,
        )
        await self.terminus.setup(environment)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if self.terminus is None:
            raise RuntimeError("LoopsTerminus2.run before setup")
        try:
            await self.terminus.run(instruction, environment, context)
        finally:
            # Terminus-2 fills Harbor's context itself, so Harbor skips populate_context_post_run: the
            # transcript must be recorded here, whether the episode ended, timed out or raised.
            calls = self.attempt.services.capture.calls if self.attempt is not None else []
            self.transcript = terminus_transcript(
                getattr(self.terminus, "_trajectory_steps", None) or [], calls
            )
            self.record_transcript(context)


def terminus_transcript(steps: Sequence[Step], calls: Sequence[ModelCall]) -> list[ChatMessage]:
    """An episode as a person reads it: Terminus-2's prompt, then per model call its reply, the keystrokes it
    sent to tmux and what the pane showed. Without Terminus-2's steps (it failed before recording one),
    the captured calls' replies."""
    transcript: list[ChatMessage] = []
    for step in steps:
        message = step.message if isinstance(step.message, str) else str(step.message)
        if step.source != "agent":
            transcript.append({"role": "user" if step.source == "user" else "system", "content": message})
            continue
        turn: ChatMessage = {"role": "assistant", "content": message}
        if step.reasoning_content:
            turn["reasoning"] = step.reasoning_content
        keystrokes = [
            str(call.arguments.get("keystrokes", ""))
            for call in step.tool_calls or []
            if call.function_name == "bash_command"
        ]
        if keystrokes:
            turn["keystrokes"] = keystrokes
        if any(call.function_name == "mark_task_complete" for call in step.tool_calls or []):
            turn["task_complete"] = True
        transcript.append(turn)
        for result in step.observation.results if step.observation else []:
            if result.content:
                content = result.content if isinstance(result.content, str) else str(result.content)
                transcript.append({"role": "terminal", "content": content})
    if not any(turn["role"] == "assistant" for turn in transcript):
        transcript += [{"role": "assistant", "content": call.text} for call in calls]
    return transcript
