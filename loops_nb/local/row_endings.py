"""How each row of a sampler decode batch ends: on a stop token, on a stop string, at its length, or when
its caller gives up.

A finished row becomes its request's `SampledChoice`; when a request's last row finishes, its future gets
the `SampleResult`. A row whose caller gave up is dropped from the batch and its future fails with
`SampleAbandoned`; the rows still running decode on without it.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from loops_nb.errors import TrainerError
from loops_nb.local.sampler_batch import Row
from loops_nb.local.sampling_types import FinishReason, SampledChoice

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class SampleAbandoned(TrainerError):
    """The request's caller gave up before its answer was ready; it was stopped, not finished."""


class RowEndings:
    """Records each step's tokens into the rows of a batch and finishes the rows that end."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stats: collections.Counter[str]) -> None:
        self.tokenizer = tokenizer
        self.stats = stats
        """The engine's batch statistics; an abandoned row counts under `abandoned_rows`."""

    def record(self, rows: list[Row], tokens: list[int], logprobs: list[float]) -> list[int]:
        """Append each row's new token; finish the rows that stopped. Returns the indices still running."""
        keep = []
        for i, (row, token, logprob) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            if logprob != logprob:  # NaN: the weights are broken, not the request
                raise FloatingPointError("the model produced NaN logits")
            job = row.job
            if job.abandoned:  # dropped from the batch: the rows still running decode on without it
                self.stats["abandoned_rows"] += 1
                if not job.future.done():
                    job.future.set_exception(SampleAbandoned("the caller gave up on this request"))
                continue
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token in job.stop_ids:
                self._finish(row, "stop", drop_last=True)
            elif job.request.stop and self._stop_string_hit(row):
                self._finish(row, "stop", cut_at_stop=True)
            elif len(row.tokens) >= job.max_tokens:
                self._finish(row, "length")
            else:
                keep.append(i)
        return keep

    def _stop_string_hit(self, row: Row) -> bool:
        # A stop string first seen now ends in the newest token; each token adds at least one byte, so the
        # last len(bytes) tokens hold all of it, plus slack for a character split across tokens and for
        # special tokens that decode to nothing. Decoding only this tail keeps the check O(1) per step.
        strings = row.job.request.stop_strings
        window = max(len(s.encode()) for s in strings) + 8
        tail = self._text(row.tokens[-window:])
        return any(s in tail for s in strings)

    def _text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _finish(
        self, row: Row, reason: FinishReason, *, drop_last: bool = False, cut_at_stop: bool = False
    ) -> None:
        job = row.job
        text = self._text(row.tokens[:-1] if drop_last else row.tokens)
        if cut_at_stop:
            found = [i for i in (text.find(s) for s in job.request.stop_strings) if i >= 0]
            text = text[: min(found)] if found else text
        job.choices[row.index] = SampledChoice(row.tokens, row.logprobs, reason, text)
        if all(choice is not None for choice in job.choices):
            job.future.set_result(job.result())
