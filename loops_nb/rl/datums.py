"""Turning captured sequences and advantages into trainer Datums, and batches of them; what a datum holds, and
why only sampled tokens train: docs/reference/training_loop.md (step 5, Datums).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from loops_nb.llm.capture import CapturedSequence


@dataclass(frozen=True)
class SequenceDatum:
    """One training sequence with its advantage, ready for the wire."""

    tokens: list[int]
    sampled: list[bool]
    logprobs: list[float]
    advantage: float
    attempt_id: str
    images: tuple[Any, ...] = ()
    """Images in `tokens` (`model_input.PromptImage`): they travel as the SDK's image chunks."""

    @property
    def trained_tokens(self) -> int:
        return sum(self.sampled[1:])

    def model_input(self) -> Any:
        """All the tokens as a `ModelInput` (for scoring the whole sequence)."""
        from loops_nb.llm.model_input import model_input

        return model_input(self.tokens, self.images)

    def to_datum(self) -> Any:
        from baseten.loops import Datum, TensorData

        from loops_nb.llm.model_input import model_input

        n = len(self.tokens) - 1
        mask = [1.0 if s else 0.0 for s in self.sampled[1:]]

        def floats(values: list[float]) -> Any:
            return TensorData(data=values, dtype="float32", shape=[n])

        return Datum(
            model_input=model_input(self.tokens[:-1], self.images),
            loss_fn_inputs={
                "target_tokens": TensorData(data=self.tokens[1:], dtype="int64", shape=[n]),
                "logprobs": floats([lp if m else 0.0 for lp, m in zip(self.logprobs[1:], mask, strict=True)]),
                "advantages": floats([self.advantage * m for m in mask]),
                "mask": floats(mask),
            },
        )


def sequence_datums(
    sequences: Sequence[CapturedSequence], advantage: float, attempt_id: str
) -> list[SequenceDatum]:
    """The datums of one attempt; sequences with nothing sampled past the first token are skipped."""
    out = []
    for seq in sequences:
        if len(seq.tokens) < 2 or not any(seq.sampled[1:]):
            continue
        out.append(
            SequenceDatum(
                list(seq.tokens),
                list(seq.sampled),
                list(seq.logprobs),
                advantage,
                attempt_id,
                tuple(getattr(seq, "images", ())),
            )
        )
    return out


def token_batches(datums: Sequence[SequenceDatum], max_tokens: int) -> Iterator[list[SequenceDatum]]:
    """Split one step's datums into forward_backward calls of at most `max_tokens` tokens each.

    The trainer accumulates gradients across calls and normalises at optim_step, so the split changes
    request sizes, not the update.
    """
    batch: list[SequenceDatum] = []
    size = 0
    for d in datums:
        n = len(d.tokens) - 1
        if batch and size + n > max_tokens:
            yield batch
            batch, size = [], 0
        batch.append(d)
        size += n
    if batch:
        yield batch
