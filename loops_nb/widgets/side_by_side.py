"""Two (or more) models' replies to the same prompts, side by side, each token's logprob on hover (how to use
it: docs/reference/after_training.md).

The samplers are duck-typed (`Sampler`), so the widget imports no sampling code. Each token is a ``<span>``
whose ``title`` holds its logprob, shaded lighter the less likely it was.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Protocol

from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import FONT, GREY, MONOSPACE, div, fmt, heading, tag

if TYPE_CHECKING:
    from loops_nb.policy_sampler import ChatReply

_GREY = f"font-weight:400;color:{GREY}"
_MONO = f"font:12px/1.5 {MONOSPACE}"

Prompt = str | Sequence[Mapping[str, Any]]
"""A prompt: a string (one user message), or chat messages (``{"role": ..., "content": ...}``)."""


class Sampler(Protocol):
    """A model to ask (`loops_nb.policy_sampler.PolicySampler` is one): its ``label``, and ``chat`` /
    ``chat_sync`` taking a prompt and sampling settings (``max_tokens``, ``temperature``, ...)."""

    @property
    def label(self) -> str: ...
    @property
    def chat(self) -> Callable[..., Awaitable[ChatReply]]: ...
    @property
    def chat_sync(self) -> Callable[..., ChatReply]: ...


def _prompt_text(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    last = [m for m in prompt if m.get("role") == "user"] or list(prompt)
    return str(last[-1].get("content", "")) if last else ""


@dataclass(eq=False)
class SideBySide(Widget):
    """``replies[i][j]``: the reply of model ``labels[j]`` to ``prompts[i]``."""

    prompts: Sequence[Prompt]
    labels: Sequence[str]
    replies: Sequence[Sequence[ChatReply]]

    def totals(self) -> list[tuple[int, float | None]]:
        """Per model: reply tokens over all prompts, and the mean logprob of those tokens."""
        out = []
        for j in range(len(self.labels)):
            values = [
                v for row in self.replies for v in row[j].logprobs if v is not None and math.isfinite(v)
            ]
            tokens = sum(row[j].completion_tokens for row in self.replies)
            out.append((tokens, sum(values) / len(values) if values else None))
        return out

    def summary(self) -> str:
        parts = [
            f"{label}: {tokens} tokens, mean logprob {fmt(mean, 3)}"
            for label, (tokens, mean) in zip(self.labels, self.totals(), strict=True)
        ]
        return f"SideBySide({len(self.prompts)} prompts; " + "; ".join(parts) + ")"

    __repr__ = summary

    def __str__(self) -> str:
        lines = [self.summary()]
        for prompt, row in zip(self.prompts, self.replies, strict=True):
            lines.append(f"prompt: {_prompt_text(prompt)}")
            for label, reply in zip(self.labels, row, strict=True):
                lines.append(
                    f"  [{label}] ({reply.completion_tokens} tokens, mean logprob {fmt(reply.mean_logprob, 3)}) "
                    f"{reply.text}"
                )
        return "\n".join(lines)

    def to_html(self) -> str:
        cell = "padding:4px 8px;border-bottom:1px solid #e5e7eb;vertical-align:top;text-align:left"
        head = tag("th", "prompt", f"{cell};color:#374151") + "".join(
            tag(
                "th",
                f"{escape(label)} " + tag("span", f"{tokens} tokens · mean logprob {fmt(mean, 3)}", _GREY),
                f"{cell};color:#374151",
            )
            for label, (tokens, mean) in zip(self.labels, self.totals(), strict=True)
        )
        rows = []
        for prompt, row in zip(self.prompts, self.replies, strict=True):
            cells = [tag("td", escape(_prompt_text(prompt)), f"{cell};color:#57606a;max-width:260px")]
            for reply in row:
                meta = (
                    f"{reply.prompt_tokens} prompt + {reply.completion_tokens} reply tokens · mean logprob "
                    f"{fmt(reply.mean_logprob, 3)} · stop {escape(reply.stop_reason)}"
                )
                tokens = div(_tokens_html(reply), f"{_MONO};white-space:pre-wrap;word-wrap:break-word")
                cells.append(tag("td", tokens + div(meta, f"color:{GREY};{FONT}"), f"{cell};max-width:420px"))
            rows.append(tag("tr", "".join(cells)))
        table = tag("table", tag("tr", head) + "".join(rows), "border-collapse:collapse;font-size:12px")
        return div(heading(self.summary(), "hover a token for its logprob") + table, f"{FONT};color:#1f2328")

    def plain_text(self) -> str:
        return str(self)


def _tokens_html(reply: ChatReply) -> str:
    spans = []
    for n, (text, logprob) in enumerate(zip(reply.token_texts, reply.logprobs, strict=True)):
        if logprob is None or not math.isfinite(logprob):
            title, alpha = f"token {n + 1}: {text!r}", 0.0
        else:
            p = math.exp(logprob)
            title = f"token {n + 1}: {text!r} · logprob {logprob:.3f} · p {p:.3f}"
            alpha = 0.08 + 0.32 * p  # likelier tokens darker
        style = f"background:rgba(37,99,235,{alpha:.2f});border-right:1px solid rgba(255,255,255,0.8)"
        spans.append(tag("span", escape(text), style, title))
    return "".join(spans)


async def side_by_side(prompts: Sequence[Prompt] | str, *samplers: Sampler, **sampling: object) -> SideBySide:
    """Ask every sampler every prompt (a string, or a message list) with the same ``sampling`` settings
    (``max_tokens``, ``temperature``, ...), concurrently."""
    prompts = _prompts(prompts, samplers)
    replies = await asyncio.gather(*(s.chat(p, **sampling) for p in prompts for s in samplers))
    k = len(samplers)
    rows = [replies[i * k : (i + 1) * k] for i in range(len(prompts))]
    return SideBySide(prompts, [s.label for s in samplers], rows)


def side_by_side_sync(prompts: Sequence[Prompt] | str, *samplers: Sampler, **sampling: object) -> SideBySide:
    """`side_by_side` for a cell or script that does not await: each sampler's ``chat_sync``, one at a time."""
    prompts = _prompts(prompts, samplers)
    rows = [[s.chat_sync(p, **sampling) for s in samplers] for p in prompts]
    return SideBySide(prompts, [s.label for s in samplers], rows)


def _prompts(prompts: Sequence[Prompt] | str, samplers: Sequence[Sampler]) -> list[Prompt]:
    if not samplers:
        raise ValueError("side_by_side needs at least one sampler (e.g. policy.base(), policy)")
    return [prompts] if isinstance(prompts, str) else list(prompts)
