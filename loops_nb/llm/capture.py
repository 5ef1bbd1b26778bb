"""Exact token capture: every model call's prompt tokens, sampled ids and logprobs, joined into
training sequences.

Text is never re-tokenized into training data. A call whose prompt extends the previous call's
prompt + completion continues the same sequence (the new prompt tokens between turns are context,
not targets); a call that does not extend it starts a new sequence, and its cause is kept (breaks.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.llm.chat_messages import ChatMessage, ToolCall
    from loops_nb.llm.model_input import PromptImage

# Why a call started a new sequence (breaks.py tells them apart; kept here so grpo's import stays light).
TEMPLATE_REWROTE_HISTORY = "template_rewrote_history"
REASONING_DROPPED = "reasoning_dropped"
TOOL_CALL_RERENDERED = "tool_call_rerendered"
HISTORY_EDITED = "history_edited"
TRUNCATION = "truncation"
CAUSES = (TEMPLATE_REWROTE_HISTORY, REASONING_DROPPED, TOOL_CALL_RERENDERED, HISTORY_EDITED, TRUNCATION)
"""Every cause, in the order steps.jsonl lists them."""

_SHOWN_TOKENS = 8
"""Tokens decoded on each side of a break's first difference: enough to recognise the markup, small enough
for a rollouts row."""


@dataclass(frozen=True)
class SequenceBreak:
    """One call that started a new sequence: why, and where its prompt first left the previous tokens."""

    cause: str
    """One of `CAUSES`."""
    first_difference: str
    """`at token N: was '...', now '...'`: the previous prompt + completion and the new prompt, decoded from
    the first token that differs."""


@dataclass(frozen=True)
class ModelCall:
    """One sampled completion, exactly as the sampler returned it."""

    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    images: tuple[Any, ...] = ()
    """The prompt's images (`model_input.PromptImage`: offset and length of its image tokens, PNG bytes)."""
    messages: list[ChatMessage] = field(default_factory=list)
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
    """Images in the sequence (`model_input.PromptImage`, offsets into `tokens`)."""

    def extend(self, call: ModelCall) -> None:
        self.images += [im for im in call.images if im.offset >= len(self.tokens)]
        new_context = call.prompt_tokens[len(self.tokens) :]
        self.tokens += new_context + call.completion_tokens
        self.sampled += [False] * len(new_context) + [True] * len(call.completion_tokens)
        self.logprobs += [0.0] * len(new_context) + list(call.logprobs)
        self.policy_versions.append(call.policy_version)
        self.calls += 1


@dataclass
class TokenCapture:
    """The model calls of one attempt."""

    calls: list[ModelCall] = field(default_factory=list)
    breaks_at: list[SequenceBreak | None] = field(default_factory=list)
    """For each call in `calls`, why it started a new sequence (None: it extends the previous call, or is
    the first)."""
    cut_off: int = 0
    """Model calls that started but whose completion never reached the agent: cancelled while in flight
    (the agent's timeout, a client that gave up), or sampled by the gateway for a client that had gone.
    None of them is in `calls`, so none trains."""

    @property
    def breaks(self) -> Counter[str]:
        """The attempt's sequence breaks by cause (breaks.CAUSES)."""
        return Counter(b.cause for b in self.breaks_at if b is not None)

    def break_records(self) -> list[dict[str, Any]]:
        """Each break as the attempt's rollouts row and transcript keep it: the call, its cause and the
        first tokens that differ."""
        return [
            {"call": i, "cause": b.cause, "first_difference": b.first_difference}
            for i, b in enumerate(self.breaks_at)
            if b is not None
        ]

    def last_call(self) -> ModelCall | None:
        """The latest call: the one a next turn should extend."""
        return self.calls[-1] if self.calls else None

    def record(self, call: ModelCall, explain: Callable[[ModelCall], SequenceBreak] | None = None) -> None:
        """Add `call`; when it does not extend the latest call, `explain(latest)` says why (the renderer
        knows: breaks.classify_break), else the break counts as the template's."""
        previous = self.last_call()
        found = None
        if previous is not None and not _extends_call(call, previous):
            found = (
                explain(previous)
                if explain is not None
                else _unexplained(call, previous, TEMPLATE_REWROTE_HISTORY)
            )
        self.calls.append(call)
        self.breaks_at.append(found)

    def withdraw(self, call: ModelCall) -> None:
        """Take back a recorded call whose completion was never delivered: it must not train."""
        kept = [(c, b) for c, b in zip(self.calls, self.breaks_at, strict=True) if c is not call]
        self.calls = [c for c, _ in kept]
        self.cut_off += 1
        # Recheck: the withdrawn call may have been a break, or the call after it may now be one (a reply the
        # agent never saw is not in the conversation that follows: an edit of what the capture holds).
        self.breaks_at = [
            None
            if i == 0 or _extends_call(c, self.calls[i - 1])
            else (b or _unexplained(c, self.calls[i - 1], HISTORY_EDITED))
            for i, (c, b) in enumerate(kept)
        ]

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


def _extends_call(call: ModelCall, previous: ModelCall) -> bool:
    return extends(call, previous.prompt_tokens + previous.completion_tokens, previous.images)


def _unexplained(call: ModelCall, previous: ModelCall, cause: str) -> SequenceBreak:
    """A break no renderer explained: its first difference as token ids."""
    return SequenceBreak(
        cause, first_difference(previous.prompt_tokens + previous.completion_tokens, call.prompt_tokens)
    )


def first_difference(
    before: Sequence[int], prompt: Sequence[int], decode: Callable[[list[int]], str] = str
) -> str:
    """Where `prompt` first leaves `before`, decoded a few tokens on each side (as ids without `decode`)."""
    at = next(
        (i for i, (a, b) in enumerate(zip(before, prompt, strict=False)) if a != b),
        min(len(before), len(prompt)),
    )
    was = decode(list(before[at : at + _SHOWN_TOKENS]))
    now = decode(list(prompt[at : at + _SHOWN_TOKENS]))
    return f"at token {at}: was {was[:80]!r}, now {now[:80]!r}"
