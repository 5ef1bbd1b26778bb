"""`LoopsLLM`: the handle an agent calls the model through, and `llm()` inside an episode: each call renders
with the run's renderer, samples the current policy, parses the reply by the same renderer and records the
exact tokens in the attempt's `TokenCapture`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loops_nb.errors import ModelAccessError
from loops_nb.llm.breaks import classify_break
from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.llm.chat_messages import ChatMessage, ToolCall, ToolSpec, assistant_message
from loops_nb.llm.renderer import Renderer


class PolicySource(Protocol):
    """Where the current policy is sampled: the run's latest published sampling client."""

    @property
    def sampling_client(self) -> Any: ...

    @property
    def version(self) -> int: ...


@dataclass(frozen=True)
class Reply:
    """One model reply: the assistant message to append, and what was sampled."""

    content: str
    tool_calls: list[ToolCall]
    text: str
    finish_reason: str
    tokens: int
    tool_call_errors: list[str] = field(default_factory=list)
    reasoning: str = ""
    """What the model reasoned before answering (a `<think>` block, an analysis channel); empty when none."""

    @property
    def message(self) -> ChatMessage:
        """The assistant message to append to the conversation (`assistant_message`)."""
        return assistant_message(self.content, self.tool_calls, self.reasoning)


@dataclass
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    max_seq_len: int | None = None


class ContextTooLong(ModelAccessError):
    """The conversation no longer fits `max_seq_len`; the attempt is discarded as truncated."""


class LoopsLLM:
    """The model, for one attempt. `await llm.chat(messages, tools=...)` returns a `Reply`."""

    def __init__(
        self,
        renderer: Renderer,
        policy: PolicySource,
        capture: TokenCapture | None = None,
        defaults: SamplingDefaults | None = None,
        seed: int | None = None,
        on_sampling_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.renderer = renderer
        self.policy = policy
        self.on_sampling_error = on_sampling_error
        """Told of every failed sample before it is raised (the run uses it to see Loops itself gone)."""
        self.capture = capture if capture is not None else TokenCapture()
        self.defaults = defaults or SamplingDefaults()
        self._seeds = itertools.count(seed + 1) if seed is not None else None

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
    ) -> Reply:
        """The reply to `messages` (`sample` with one reply)."""
        replies = await self.sample(
            messages, tools=tools, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop
        )
        return replies[0]

    async def sample(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
    ) -> list[Reply]:
        """`n` replies to the same conversation; only the first is recorded as this attempt's turn."""
        from baseten.loops import SamplingParams

        from loops_nb.llm.model_input import model_input

        prompt, images = self.renderer.render_prompt(messages, tools, self.capture.last_call())
        budget = max_tokens or self.defaults.max_tokens
        if self.defaults.max_seq_len is not None:
            room = self.defaults.max_seq_len - len(prompt)
            if room <= 0:
                raise ContextTooLong(
                    f"the prompt has {len(prompt)} tokens; max_seq_len is {self.defaults.max_seq_len}"
                )
            budget = min(budget, room)
        stops: list[int] | list[str] = list(stop) if stop else list(self.renderer.stop_token_ids)
        params = SamplingParams(
            max_tokens=budget,
            temperature=self.defaults.temperature if temperature is None else temperature,
            top_p=self.defaults.top_p if top_p is None else top_p,
            stop=stops,
            seed=next(self._seeds) if self._seeds is not None else None,
        )
        client, version = self.policy.sampling_client, self.policy.version
        try:
            resp = await client.sample_async(
                model_input(prompt, images), num_samples=n, sampling_params=params
            )
        except asyncio.CancelledError:
            # Cut off in flight (the agent's timeout, a gateway client that left): it called the model.
            self.capture.cut_off += 1
            raise
        except Exception as exc:
            if self.on_sampling_error is not None:
                self.on_sampling_error(exc)
            raise
        replies = []
        for i, seq in enumerate(resp.sequences):
            logprobs = list(seq.logprobs or [])
            parsed = self.renderer.parse(seq.tokens, prompt_tokens=prompt, tools=tools)
            served = resp.policy_version if resp.policy_version is not None else version
            if i == 0:
                self.capture.record(
                    ModelCall(
                        prompt_tokens=prompt,
                        completion_tokens=list(seq.tokens),
                        logprobs=logprobs,
                        policy_version=served,
                        finish_reason=seq.stop_reason,
                        text=parsed.text,
                        tool_calls=parsed.tool_calls,
                        images=tuple(images),
                        messages=list(messages),
                    ),
                    # Said by the renderer, against whichever call the capture holds as latest by then.
                    explain=lambda latest: classify_break(self.renderer, messages, tools, latest, prompt),
                )
            replies.append(
                Reply(
                    parsed.content,
                    parsed.tool_calls,
                    parsed.text,
                    seq.stop_reason,
                    len(seq.tokens),
                    parsed.tool_call_errors,
                    parsed.reasoning,
                )
            )
        return replies


_current: contextvars.ContextVar[LoopsLLM] = contextvars.ContextVar("loops_nb_llm")


def llm() -> LoopsLLM:
    """The model handle of the attempt running in this task (inside an Episode's `run`)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("llm() is only available inside an attempt (an Episode's run method)") from None


def bind_llm(handle: LoopsLLM) -> contextvars.Token[LoopsLLM]:
    return _current.set(handle)


def unbind_llm(token: contextvars.Token[LoopsLLM]) -> None:
    _current.reset(token)
