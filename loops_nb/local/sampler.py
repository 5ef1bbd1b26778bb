"""The local sampler's compute core: one base model, LoRA adapters on it, and coalesced generation.

The HTTP layer (`/sample`, routing headers, policy versions) wraps a `SamplerEngine`. Callers on any thread
`sample()` (or `await sample_async()`); requests are queued and one worker thread owns the model: it takes
the oldest pending request, gathers the other pending requests for the same adapter (up to
`max_batch_sequences` rows and a `max_batch_tokens` KV budget) and decodes them together, one forward per
token for the whole batch, while newly arrived requests for that adapter join the running batch between
steps. Each request's `n` samples are rows of the batch with their own temperature, top-k, top-p, seed, stop
tokens, stop strings and length (see `decoding`, `sampler_batch`, `batch_forward` and `row_endings`).
`model.generate` is not used because it cannot give per-row sampling parameters, seeds and exact logprobs.

Adapter changes (`set_adapter`, `load_adapter_dir`, `remove_adapter`) are queued to the same worker and run
between batches, so a batch never sees its weights change mid-generation and the version a result reports is
the one every token was sampled with. While one is pending, running batches stop admitting new requests so
the swap waits at most for the batch in flight. The worker schedules; the compute (batches and adapter
changes) runs on the process's `COMPUTE_LANE`, shared with the trainers, and a running batch also stops
admitting requests while a trainer op waits for the lane.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from loops_nb.errors import TrainerError
from loops_nb.local.batch_forward import BatchForward
from loops_nb.local.compute_lane import COMPUTE_LANE
from loops_nb.local.decoding import select_tokens
from loops_nb.local.image_chunks import VisionInputs, max_positions
from loops_nb.local.kv_cache import cache_is_full_attention
from loops_nb.local.memory_budget import MIB, kv_token_budget, resolve_budget, weight_bytes
from loops_nb.local.model_store import auto_dtype, load_tokenizer
from loops_nb.local.prefill_plan import Prefiller
from loops_nb.local.prefix_cache import PrefixCache
from loops_nb.local.row_endings import RowEndings
from loops_nb.local.sampler_adapters import AdapterSet, read_adapter_dir
from loops_nb.local.sampler_batch import DecodeBatch, Job
from loops_nb.local.sampling_types import (
    DEFAULT_MAX_TOKENS,
    IMAGE_POSITION,
    SampleRequest,
    SampleRequestError,
    SampleResult,
)
from loops_nb.local.sdpa_variants import use_sdpa_variant
from loops_nb.local.shared_base import BASE_MODELS
from loops_nb.local.shared_prompt_kv import IMPLEMENTATION as PROMPT_ATTENTION

logger = logging.getLogger(__name__)


class SamplerClosedError(TrainerError):
    """The engine was closed before the request could finish."""


class SamplerEngine:
    """A causal LM with LoRA adapters that serves `SampleRequest`s from many threads in shared batches."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        bf16_products: bool = False,
        max_batch_tokens: int | None = None,
        max_batch_sequences: int = 64,
        memory_budget_mb: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        prefix_cache_mb: int | None = None,
        share_prompts: bool = True,
    ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:  # as `[compute.local] dtype = "auto"`, so the trainer and sampler agree
            dtype = auto_dtype(self.device)
        # The base weights are shared with every trainer on this model (see shared_base).
        self.model = BASE_MODELS.instance(model_path, self.device, dtype, bf16_products=bf16_products)
        self.vision = VisionInputs.load(model_path, self.model)
        """The processor and image token of a vision-language model: image prompts then work."""
        # The process's shared copy (`model_store.load_tokenizer`): the run's renderer usually holds it already.
        self.tokenizer = tokenizer or load_tokenizer(model_path)
        config = self.model.config
        budget = resolve_budget(memory_budget_mb, weight_bytes(self.model))
        self.max_batch_tokens = (
            kv_token_budget(self.model, budget) if max_batch_tokens is None else max_batch_tokens
        )
        """Prompt and new tokens a batch may hold in its KV cache (the memory budget over bytes per token)."""
        self.max_batch_sequences = max_batch_sequences
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.max_positions: int | None = max_positions(config)
        self.eos_token_ids = self._eos_ids()
        self._mergeable = cache_is_full_attention(config)
        self._share = share_prompts and self._mergeable and use_sdpa_variant(self.model, PROMPT_ATTENTION)
        """A prompt's rows share its keys and values (`shared_prompt_kv`); False: each row holds a copy."""
        prefix_bytes = budget if prefix_cache_mb is None else prefix_cache_mb * MIB
        self.prefix_cache = PrefixCache(prefix_bytes) if prefix_bytes and self._mergeable else None
        """Finished sequences' keys and values, so a call that extends one prefills only its new tokens
        (`prefix_cache_mb`: None keeps as much as the KV budget, 0 none)."""
        self._batch_forward = BatchForward(self.model, self.vision, self.device)
        self._adapters = AdapterSet(self.model)
        # Batch statistics, for tests and the debug endpoint: batches run, rows decoded, requests that joined.
        self.stats: collections.Counter[str] = collections.Counter()
        self._endings = RowEndings(self.tokenizer, self.stats)
        self._prefiller = Prefiller(
            self._batch_forward,
            self._decode,
            self._mergeable,
            self.prefix_cache,
            self.stats,
            self._share,
        )

        self._cv = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._jobs: weakref.WeakKeyDictionary[Future[SampleResult], Job] = weakref.WeakKeyDictionary()
        self._ops: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self._closing = False
        self._worker = threading.Thread(target=self._work, name="loops-sampler", daemon=True)
        self._worker.start()

    # -- requests ----------------------------------------------------------------------------------------

    def submit(self, request: SampleRequest, adapter: str | None = None) -> Future[SampleResult]:
        """Queue `request` for adapter `adapter` (None: the base model); the future resolves when it is done."""
        return self.submit_many([(request, adapter)])[0]

    def submit_many(self, items: list[tuple[SampleRequest, str | None]]) -> list[Future[SampleResult]]:
        """Queue several requests at once (so they are certain to be considered for the same batch)."""
        jobs = [self._job(request, adapter) for request, adapter in items]
        with self._cv:
            if self._closing:
                raise SamplerClosedError("the sampler engine is closed")
            self._queue.extend(jobs)
            self._jobs.update((job.future, job) for job in jobs)
            self._cv.notify_all()
        return [job.future for job in jobs]

    def abandon(self, future: Future[SampleResult]) -> None:
        """The caller of `future` gave up (its client went away, its attempt timed out).

        A queued request is dropped; a running one stops decoding at its next token instead of running to
        `max_tokens`, so no core is spent on an answer nobody will read. Its future then fails with
        `SampleAbandoned`."""
        if future.cancel():  # still queued: `_take_jobs` skips a cancelled future
            return
        with self._cv:
            job = self._jobs.get(future)
        if job is not None:
            job.abandoned = True

    def sample(self, request: SampleRequest, adapter: str | None = None) -> SampleResult:
        """Generate `request.n` completions of `request.prompt` (blocking; safe from any thread)."""
        return self.submit(request, adapter).result()

    async def sample_async(self, request: SampleRequest, adapter: str | None = None) -> SampleResult:
        """`sample` for an event loop; cancelling the await abandons the request (see `abandon`)."""
        future = self.submit(request, adapter)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.abandon(future)
            raise

    def validate(self, request: SampleRequest, adapter: str | None = None) -> int:
        """Check `request` against this model; returns its max_tokens. Raises `SampleRequestError` (a 422)."""
        if max(request.prompt) >= self.vocab_size:
            raise SampleRequestError("prompt", f"token id {max(request.prompt)} is outside the vocabulary")
        if request.stop_token_ids and max(request.stop_token_ids) >= self.vocab_size:
            raise SampleRequestError("stop_token_ids", "token ids must be within the vocabulary")
        if adapter is not None and self._adapters.version(adapter) is None:
            raise SampleRequestError("adapter", f"no LoRA adapter {adapter!r} is loaded")
        room = None if self.max_positions is None else self.max_positions - len(request.prompt)
        if room is not None and room < 1:
            raise SampleRequestError(
                "prompt", f"{len(request.prompt)} tokens leave no room under the model's {self.max_positions}"
            )
        if request.max_tokens is None:
            return DEFAULT_MAX_TOKENS if room is None else min(DEFAULT_MAX_TOKENS, room)
        if room is not None and request.max_tokens > room:
            raise SampleRequestError(
                "max_tokens",
                f"{request.max_tokens} new tokens after a {len(request.prompt)}-token prompt exceed the "
                f"model's {self.max_positions} positions (at most {room})",
            )
        return request.max_tokens

    def _job(self, request: SampleRequest, adapter: str | None) -> Job:
        max_tokens = self.validate(request, adapter)
        stop_ids = frozenset(self.eos_token_ids) | frozenset(request.stop_token_ids or ())
        job = Job(request, adapter, Future(), max_tokens, stop_ids)
        if request.images:
            if self.vision is None:
                raise SampleRequestError(
                    "model_input_chunks", "image chunks need a vision-language model; this model is text-only"
                )
            try:
                job.pixels = self.vision.pixels(request.images, "model_input_chunks image")
            except ValueError as exc:
                raise SampleRequestError("model_input_chunks", str(exc)) from None
            image = self.vision.image_token_id
            job.expanded = [image if t == IMAGE_POSITION else t for t in request.prompt]
        return job

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        return ids

    # -- adapters ----------------------------------------------------------------------------------------

    def set_adapter(
        self, key: str, lora_config: Mapping[str, Any], state_dict: Mapping[str, Tensor], version: int
    ) -> None:
        """Install or replace the LoRA weights served as `key` (in place when the config is unchanged)."""

        def install() -> None:
            self._forget_prefixes(key)
            self._adapters.install(key, lora_config, state_dict, version)

        self._run_op(install)

    def load_adapter_dir(self, key: str, path: str | Path, version: int = 0) -> None:
        """Serve the PEFT `save_pretrained` directory `path` as adapter `key`."""
        config, weights = read_adapter_dir(path)
        self.set_adapter(key, config, weights, version)

    def remove_adapter(self, key: str) -> None:
        def remove() -> None:
            self._forget_prefixes(key)
            self._adapters.remove(key)

        self._run_op(remove)

    def _forget_prefixes(self, key: str) -> None:
        # New weights under a key (even at a version number seen before) make its kept keys and values stale.
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(key)

    def adapter_version(self, key: str) -> int | None:
        return self._adapters.version(key)

    def _run_op[T](self, op: Callable[[], T]) -> T:
        future: Future[T] = Future()
        with self._cv:
            if self._closing:
                raise SamplerClosedError("the sampler engine is closed")
            if COMPUTE_LANE.on_lane():
                # A trainer op publishing weights: the worker waits for the lane this caller holds, so no
                # batch is running, and queueing the op for the worker would deadlock.
                return op()
            self._ops.append((op, future))
            self._cv.notify_all()
        return future.result()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker; queued and running requests fail with `SamplerClosedError`."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._worker.join()

    def __enter__(self) -> SamplerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker --------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cv:
                while not (self._ops or self._queue or self._closing):
                    self._cv.wait()
                if self._closing:
                    pending, self._queue = list(self._queue), collections.deque()
                    ops, self._ops = list(self._ops), collections.deque()
                    break
                ops, self._ops = list(self._ops), collections.deque()
                jobs = [] if ops else self._take_jobs(None, 0, 0, 0, set())
            for op, future in ops:
                try:
                    future.set_result(COMPUTE_LANE.run(op))
                except Exception as exc:
                    future.set_exception(exc)
            if jobs:
                COMPUTE_LANE.run(functools.partial(self._run_batch, jobs))
        closed = SamplerClosedError("the sampler engine was closed")
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(closed)
        for _, future in ops:
            future.set_exception(closed)

    def _take_jobs(
        self, adapter: str | None, rows: int, cache_length: int, new_tokens: int, held: set[tuple[int, ...]]
    ) -> list[Job]:
        """Pop the queued jobs a batch can take (call with `_cv` held). With `rows == 0` a new batch is
        started for the oldest job's adapter; otherwise jobs join a running one for `adapter`, and only while
        the oldest job is for that adapter, so one busy adapter cannot starve the others.

        The KV budget counts what the batch will hold: with shared prompts each prompt once (`held`: those
        the running batch has) and every row's own `cache_length` and new tokens, else every row's prompt."""
        prompt_tokens = sum(len(p) for p in held)
        if not self._queue or (
            rows and (self._ops or self._queue[0].adapter != adapter or COMPUTE_LANE.contended())
        ):
            return []
        if rows == 0:
            adapter = self._queue[0].adapter
            if self._queue[0].pixels is not None:  # an image prompt decodes alone (its own rotary positions)
                job = self._queue.popleft()
                return [job] if job.future.set_running_or_notify_cancel() else []
        taken: list[Job] = []
        for job in list(self._queue):
            if job.adapter != adapter or job.pixels is not None:
                continue
            total_rows = rows + job.rows
            steps = max(new_tokens, job.max_tokens)
            if self._share:
                length, prompt = cache_length, tuple(job.prompt)
                held_tokens = prompt_tokens + (0 if prompt in held else len(prompt))
            else:
                length, held_tokens = max(cache_length, len(job.prompt)), 0
            if (rows or taken) and (
                total_rows > self.max_batch_sequences
                or held_tokens + total_rows * (length + steps) > self.max_batch_tokens
            ):
                break
            self._queue.remove(job)
            if job.future.set_running_or_notify_cancel():
                taken.append(job)
                rows, cache_length, new_tokens, prompt_tokens = total_rows, length, steps, held_tokens
                if self._share:
                    held.add(tuple(job.prompt))
        return taken

    def _decode(self, ids: list[int]) -> list[str]:
        return self.tokenizer.batch_decode([[i] for i in ids])

    def _run_batch(self, jobs: list[Job]) -> None:
        adapter = jobs[0].adapter
        running = list(jobs)
        try:
            with torch.inference_mode():
                if adapter is not None and self._adapters.version(adapter) is None:
                    raise SampleRequestError("adapter", f"LoRA adapter {adapter!r} was removed")
                version = self._adapters.activate(adapter)
                for job in jobs:
                    job.adapter_version = version
                vision = jobs[0].pixels is not None
                if vision:
                    batch = self._prefiller.batch(jobs, self._batch_forward.image_prompt(jobs[0]))
                else:
                    batch = self._prefiller.prefill(jobs)
                self.stats["batches"] += 1
                self.stats["rows"] += len(batch.rows)
                while batch.rows:
                    if self._closing:
                        raise SamplerClosedError("the sampler engine was closed mid-generation")
                    if self._mergeable and self._queue and not vision:
                        joined = self._join(batch, adapter, version)
                        running += joined
                    tokens, logprobs = select_tokens(batch.logits, batch.params)
                    keep = self._endings.record(batch.rows, tokens.tolist(), logprobs.tolist())
                    self._prefiller.keep_finished(batch, keep)
                    if not keep:
                        break
                    if len(keep) < len(batch.rows):
                        batch.keep(keep, trim=self._mergeable)
                        tokens = tokens[torch.tensor(keep, device=tokens.device)]
                    batch.advance(tokens)
        except Exception as exc:
            if not isinstance(exc, SamplerClosedError):
                logger.exception("sampling batch failed")
            for job in running:
                if not job.future.done():
                    job.future.set_exception(exc)

    def _join(self, batch: DecodeBatch, adapter: str | None, version: int | None) -> list[Job]:
        """Admit queued requests for `adapter` into the running `batch` (continuous batching)."""
        remaining = max(row.job.max_tokens - len(row.tokens) for row in batch.rows)
        with self._cv:
            held = set() if batch.prompts is None else {slot.prompt for slot in batch.prompts.slots}
            jobs = self._take_jobs(adapter, len(batch.rows), batch.cache_length, remaining, held)
        if jobs:
            for job in jobs:
                job.adapter_version = version
            batch.merge(self._prefiller.prefill(jobs))
            self.stats["joined"] += len(jobs)
            self.stats["rows"] += sum(job.rows for job in jobs)
        return jobs
