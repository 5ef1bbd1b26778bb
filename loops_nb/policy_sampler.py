"""Try what a run trained: chat with one of its checkpoints (or the base model) from a cell or a script
(docs/reference/after_training.md#try-the-policy).

The prompt is rendered, and the reply parsed, by the renderer the run recorded, exactly as training did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.llm.chat_messages import ChatMessage, ToolCall, ToolSpec
from loops_nb.run_checkpoints import BASE, RunCheckpoint, checkpoint_sampling_client, find_checkpoint
from loops_nb.saved_run import SavedRun

if TYPE_CHECKING:
    from baseten.loops import SamplingClient

    from loops_nb.compute import LoopsConnection
    from loops_nb.llm.renderer import Renderer


@dataclass(frozen=True)
class ChatReply:
    """One sampled reply, with its exact tokens."""

    label: str
    """Which model answered (``base``, ``final-000012``, ...)."""
    text: str
    """The reply decoded without special tokens."""
    content: str
    """The reply's prose, tool calls and reasoning markup parsed out."""
    tool_calls: list[ToolCall]
    prompt_tokens: int
    tokens: list[int]
    """The sampled token ids."""
    token_texts: list[str]
    """Each sampled token decoded on its own (special tokens included), for previews."""
    logprobs: list[float | None]
    """The sampler's logprob of each sampled token (None where it returned none)."""
    stop_reason: str
    reasoning: str = ""
    """What the model reasoned before answering (a `<think>` block, an analysis channel); empty when none."""

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def mean_logprob(self) -> float | None:
        values = [v for v in self.logprobs if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    def describe(self) -> str:
        mean = self.mean_logprob
        stats = (
            f"{self.prompt_tokens} prompt + {self.completion_tokens} reply tokens, stop {self.stop_reason}"
        )
        if mean is not None:
            stats += f", mean logprob {mean:.3f}"
        return f"[{self.label}] {self.text}\n  ({stats})"

    __str__ = describe


@dataclass
class _Loop:
    """A private event loop on a daemon thread, where every SDK call of a handle runs."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, name="loops-policy-sampler", daemon=True)
        self.thread.start()

    def submit[T](self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class PolicySampler:
    """A handle on one checkpoint of a run (``checkpoint``: ``latest``, a step, a name, a bt:// path, or
    ``base``); it connects on its first chat."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | SavedRun,
        checkpoint: str | int = "latest",
        *,
        _shared: PolicySampler | None = None,
    ) -> None:
        self.run = run_dir if isinstance(run_dir, SavedRun) else SavedRun.open(run_dir)
        self.checkpoint: RunCheckpoint | None = find_checkpoint(self.run.run_dir, checkpoint)
        self._owner: PolicySampler = _shared._owner if _shared is not None else self
        self._client: SamplingClient | None = None
        if _shared is None:
            self._loop: _Loop | None = _Loop()
            self._connection: LoopsConnection | None = None
            self._renderer: Renderer | None = None
            self._open_lock: asyncio.Lock | None = None

    @property
    def label(self) -> str:
        return BASE if self.checkpoint is None else self.checkpoint.name

    def __repr__(self) -> str:
        what = "the base model" if self.checkpoint is None else self.checkpoint.describe()
        return f"PolicySampler({self.run.root.name}: {what}; {self.run.model.base_model})"

    def base(self) -> PolicySampler:
        """The run's base model, sharing this handle's connection."""
        return PolicySampler(self.run, BASE, _shared=self)

    def at(self, checkpoint: str | int) -> PolicySampler:
        """Another checkpoint of the same run, sharing this handle's connection."""
        return PolicySampler(self.run, checkpoint, _shared=self)

    # -- chat ---------------------------------------------------------------------------------------------

    async def chat(
        self,
        messages: Sequence[ChatMessage] | str,
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
    ) -> ChatReply:
        """Sample one reply to ``messages`` (a string is one user turn); greedy by default."""
        future = self._submit(self._chat(messages, tools, max_tokens, temperature, top_p, seed))
        return await asyncio.wrap_future(future)

    def chat_sync(
        self,
        messages: Sequence[ChatMessage] | str,
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
    ) -> ChatReply:
        """`chat`, blocking until it is done (a script, or a cell that does not await)."""
        return self._submit(self._chat(messages, tools, max_tokens, temperature, top_p, seed)).result()

    def _submit[T](self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        loop = self._owner._loop
        if loop is None:
            coro.close()
            raise UserError(f"{self!r} is closed; open a new one (project.sampler())")
        return loop.submit(coro)

    async def _chat(
        self,
        messages: Sequence[ChatMessage] | str,
        tools: Sequence[ToolSpec] | None,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> ChatReply:
        from baseten.loops import SamplingParams

        from loops_nb.llm.model_input import model_input

        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        client = await self._sampling_client()
        renderer = self._owner._renderer
        assert renderer is not None
        prompt, images = renderer.render_prompt(list(messages), tools)
        if len(prompt) + max_tokens > self.run.model.max_seq_len:
            raise UserError(
                f"the prompt is {len(prompt)} tokens; with max_tokens {max_tokens} it passes model.max_seq_len "
                f"{self.run.model.max_seq_len}"
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(renderer.stop_token_ids),
            seed=seed,
        )
        response = await client.sample_async(
            model_input(prompt, images), num_samples=1, sampling_params=params
        )
        sequence = response.sequences[0]
        tokens = list(sequence.tokens)
        logprobs: list[float | None] = list(sequence.logprobs) if sequence.logprobs else [None] * len(tokens)
        parsed = renderer.parse(tokens, prompt_tokens=prompt, tools=tools)
        return ChatReply(
            label=self.label,
            text=parsed.text,
            content=parsed.content,
            tool_calls=list(parsed.tool_calls or []),
            prompt_tokens=len(prompt),
            tokens=tokens,
            token_texts=[renderer.decode([t]) for t in tokens],
            logprobs=logprobs,
            stop_reason=str(sequence.stop_reason),
            reasoning=parsed.reasoning,
        )

    # -- connection ---------------------------------------------------------------------------------------

    async def _sampling_client(self) -> SamplingClient:
        owner = self._owner
        if owner._open_lock is None:
            owner._open_lock = asyncio.Lock()
        async with owner._open_lock:
            if owner._connection is None:
                from loops_nb.model_renderer import load_model_renderer

                run = self.run
                owner._renderer = await asyncio.to_thread(
                    load_model_renderer,
                    run.model,
                    run.compute.scope,
                    cache_dir=run.compute.local.cache_dir,
                    run_json=run.run_json,  # as the run trained
                )
                owner._connection = await run.connect()
            if self._client is None:
                try:
                    self._client = await checkpoint_sampling_client(
                        owner._connection, self.run.model, self.checkpoint
                    )
                except UserError:
                    raise
                except Exception as exc:
                    raise UserError(f"cannot serve {self.label} of {self.run.root}: {exc}") from None
        return self._client

    async def aclose(self) -> None:
        """Close the connection (and the embedded Loops it started); the handle and its siblings end."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        owner = self._owner
        loop = owner._loop
        if loop is None:
            return
        if owner._connection is not None:
            loop.submit(owner._connection.close()).result()
            owner._connection = None
        owner._loop = None
        loop.stop()
