"""Exact token capture: every model call's prompt tokens, sampled ids and logprobs, joined into
training sequences.

Text is never re-tokenized into training data. A call whose prompt extends the previous call's
prompt + completion continues the same sequence (the new prompt tokens between turns are context,
not targets); a call that does not extend it starts a new sequence, and the reason is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.llm.vision import PromptImage

REASON_NOT_EXTENDING = "prompt_does_not_extend_previous_turn"


@dataclass(frozen=True)
class ModelCall:
    """One sampled completion, exactly as the sampler returned it."""

    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    images: tuple[Any, ...] = ()
    """The prompt's images (`vision.PromptImage`: offset and length of its image tokens, PNG bytes)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation the prompt was rendered from, as the renderer got it: a renderer that bridges on
    token ids (`PrimeRenderer`) continues this call only in a conversation that starts with it."""

    def __post_init__(self) -> None:
        if len(self.completion_tokens) != len(self.logprobs):
            raise ValueError("a model call needs exactly one logprob per sampled token")


@dataclass
class CapturedSequence:
    """A training sequence: all tokens, and for each whether it was sampled (trains) and its logprob."""

    tokens: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    calls: int = 0
    images: list[Any] = field(default_factory=list)
    """Images in the sequence (`vision.PromptImage`, offsets into `tokens`)."""

    def extend(self, call: ModelCall) -> None:
        self.images += [im for im in call.images if im.offset >= len(self.tokens)]
        new_context = call.prompt_tokens[len(self.tokens) :]
        self.tokens += new_context + call.completion_tokens
        self.sampled += [False] * len(new_context) + [True] * len(call.completion_tokens)
        self.logprobs += [0.0] * len(new_context) + list(call.logprobs)
        self.policy_versions.append(call.policy_version)
        self.calls += 1

    @property
    def sampled_count(self) -> int:
        return sum(self.sampled)


@dataclass
class TokenCapture:
    """The model calls of one attempt."""

    calls: list[ModelCall] = field(default_factory=list)
    breaks: Counter[str] = field(default_factory=Counter)
    cut_off: int = 0
    """Model calls that started but whose completion never reached the agent: cancelled while in flight
    (the agent's timeout, a client that gave up), or sampled by the gateway for a client that had gone.
    None of them is in `calls`, so none trains."""

    def last_call(self) -> ModelCall | None:
        """The latest call: the one a next turn should extend."""
        return self.calls[-1] if self.calls else None

    def last_tokens(self) -> list[int] | None:
        """Prompt + completion of the latest call: the prefix a next turn should extend."""
        if not self.calls:
            return None
        last = self.calls[-1]
        return last.prompt_tokens + last.completion_tokens

    def record(self, call: ModelCall) -> None:
        previous = self.last_tokens()
        if previous is not None and not extends(call, previous, self.calls[-1].images):
            self.breaks[REASON_NOT_EXTENDING] += 1
        self.calls.append(call)

    def withdraw(self, call: ModelCall) -> None:
        """Take back a recorded call whose completion was never delivered: it must not train."""
        self.calls = [c for c in self.calls if c is not call]
        self.cut_off += 1
        # Recount: the withdrawn call may have been a break, or the call after it may now be one.
        count = sum(
            not extends(later, earlier.prompt_tokens + earlier.completion_tokens, earlier.images)
            for earlier, later in zip(self.calls, self.calls[1:], strict=False)
        )
        if count:
            self.breaks[REASON_NOT_EXTENDING] = count
        else:
            self.breaks.pop(REASON_NOT_EXTENDING, None)

    def sequences(self) -> list[CapturedSequence]:
        """The calls joined into as few sequences as the prefix rule allows, in call order."""
        out: list[CapturedSequence] = []
        for call in self.calls:
            if out and extends(call, out[-1].tokens, out[-1].images):
                out[-1].extend(call)
            else:
                seq = CapturedSequence()
                seq.extend(call)
                out.append(seq)
        return out

    @property
    def sampled_tokens(self) -> int:
        return sum(len(c.completion_tokens) for c in self.calls)

    @property
    def policy_versions(self) -> list[int]:
        return [c.policy_version for c in self.calls]


def extends(call: ModelCall, tokens: list[int], images: Sequence[PromptImage]) -> bool:
    """Whether `call`'s prompt starts with `tokens` and, where images sit in them, the same images."""
    if call.prompt_tokens[: len(tokens)] != tokens:
        return False
    before = [im for im in call.images if im.offset < len(tokens)]
    return before == [im for im in images if im.offset < len(tokens)]
