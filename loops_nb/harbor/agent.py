"""`LoopsAgent`: a Harbor agent whose model calls go through loops_nb, so every trial trains.

Subclass it, implement Harbor's `run`, call the model with `self.llm` and act on the sandbox through
`environment.exec(...)` (docs/reference/harbor.md, "Writing a LoopsAgent"). The agent object lives in the
training process (Harbor runs only what it `exec`s in the sandbox), so `self.llm` is the attempt's own model
handle and each sampled token is captured exactly. Harbor builds agents from an import path and JSON kwargs;
the runtime passes `loops_attempt`, a key into this process's table of running attempts.
"""

from __future__ import annotations

import posixpath
import shlex
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from loops_nb.llm.chat_messages import ChatMessage
from loops_nb.llm.client import LoopsLLM
from loops_nb.runtime import Attempt

_running: dict[str, Attempt] = {}


def register_attempt(attempt: Attempt) -> str:
    """Make an attempt findable by the agent Harbor will construct; returns the key to pass it."""
    key = f"{attempt.id}#{uuid.uuid4().hex[:8]}"
    _running[key] = attempt
    return key


def forget_attempt(key: str) -> None:
    _running.pop(key, None)


class LoopsAgent(BaseAgent):
    """Base class of in-process Harbor agents trained by loops_nb. Implement `async run(...)`."""

    SUPPORTS_ATIF: ClassVar[bool] = False

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        loops_attempt: str | None = None,
        loops_config_dir: str | None = None,
        **kwargs: Any,  # Harbor's own keywords and the agent's options (`agent_kwargs`)
    ) -> None:
        super().__init__(logs_dir, model_name, **kwargs)
        self.config_dir = Path(loops_config_dir) if loops_config_dir else None
        """The training config's directory (relative paths in agent_kwargs are relative to it)."""
        self.attempt: Attempt | None = _running.get(loops_attempt) if loops_attempt else None
        if loops_attempt and self.attempt is None:
            raise RuntimeError(f"attempt {loops_attempt} is not running in this process")
        self.transcript: list[ChatMessage] = []
        """The conversation as the agent saw it; it becomes the attempt's transcript."""

    @staticmethod
    def name() -> str:
        return "loops-agent"

    def version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("loops-nb")
        except PackageNotFoundError:
            return None

    async def set_web_tools_disabled(self, disabled: bool, environment: BaseEnvironment) -> None:
        """An in-process agent has no native web tools; the sandbox's network policy covers its commands."""

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install: the agent runs here. Override to prepare the sandbox."""

    @classmethod
    def expected_calls(cls, agent_kwargs: Mapping[str, object]) -> tuple[int, str]:
        """Model calls an episode is expected to make, and what says so: `loops check` multiplies them by a
        call's time on the local scope and compares that with the task's agent timeout. Override it in an
        agent that calls the model more than once."""
        return 1, "at least one model call"

    @classmethod
    def first_prompt(cls, instruction: str, agent_kwargs: Mapping[str, object]) -> str:
        """The text of the agent's first prompt for `instruction` (its token count sizes a call's prefill)."""
        return instruction

    @property
    def llm(self) -> LoopsLLM:
        """This attempt's model handle (exact token capture, the run's sampling settings)."""
        if self.attempt is None:
            raise RuntimeError(
                f"{type(self).__name__} runs outside a loops_nb run (no loops_attempt): train it with "
                '[runtime] factory = "loops_nb.harbor:create_runtime"'
            )
        return self.attempt.services.llm

    async def write_file(self, environment: BaseEnvironment, path: str, content: str) -> None:
        """Write `content` to `path` in the sandbox (any backend), creating parent directories.

        The content travels as a file upload, not on a command line, so its size and bytes are free.
        """
        parent = posixpath.dirname(path) or "."
        made = await environment.exec(f"mkdir -p {shlex.quote(parent)}")
        if made.return_code != 0:
            raise RuntimeError(f"creating {parent} in the sandbox failed: {(made.stderr or '')[-500:]}")
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "content"
            local.write_text(content, encoding="utf-8")
            await environment.upload_file(local, path)

    def populate_context_post_run(self, context: AgentContext) -> None:
        """Record what the model did in Harbor's own result: per-call tokens and logprobs, counts.

        Harbor calls this only when the agent left its context empty; an agent that fills it (Terminus-2)
        calls `record_transcript` itself, or the attempt's transcript would hold only the verifier's lines.
        """
        if self.attempt is None:
            return
        calls = self.attempt.services.capture.calls
        context.n_input_tokens = sum(len(c.prompt_tokens) for c in calls)
        context.n_output_tokens = sum(len(c.completion_tokens) for c in calls)
        context.rollout_details = [
            {
                "prompt_token_ids": [c.prompt_tokens for c in calls],
                "completion_token_ids": [c.completion_tokens for c in calls],
                "logprobs": [c.logprobs for c in calls],
                "extra": {"policy_version": [c.policy_version for c in calls]},
            }
        ]
        self.record_transcript(context)

    def record_transcript(self, context: AgentContext) -> None:
        """Put `self.transcript` where the runtime reads it (Harbor's result metadata)."""
        context.metadata = {**(context.metadata or {}), "loops_transcript": self.transcript}
