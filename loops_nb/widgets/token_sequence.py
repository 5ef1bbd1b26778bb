"""Token sequences to preview, and the adapters that make them from SFT examples and RL captures.

A `TokenSequence` is what a preview needs: ids, one loss weight per token (0 = masked), and a label. SFT examples
carry their weights and per-token turns; RL captures know which tokens were sampled (they train, the context
does not). `as_sequences` turns any of these, or an iterable of them, into sequences, duck-typed so that the
widgets do not import the SFT or RL packages (their types only, to check this module).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from loops_nb.sft.targets import Example


class Tokenizer(Protocol):
    """What a preview calls on a tokenizer (a transformers tokenizer has both; a preview of ids alone needs
    only ``decode``)."""

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool = ...) -> str | list[str]: ...
    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class TokenSequence:
    """A sequence to preview: token ids, one loss weight per token (0 = masked), and what to call it.

    ``turns`` gives the message index each token trains for (-1 when it does not), ``note`` a remark shown under
    the header (why a row was split), ``text``/``offsets`` the exact text and per-token character spans.
    """

    input_ids: Sequence[int]
    weights: Sequence[float]
    label: str = ""
    turns: Sequence[int] | None = None
    note: str | None = None
    text: str | None = None
    offsets: Sequence[tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("weights", "turns", "offsets"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{self.label or 'sequence'}: {len(values)} {name} for {n} tokens")

    @property
    def n_trained(self) -> int:
        return sum(1 for w in self.weights if w > 0)

    @property
    def n_negative(self) -> int:
        return sum(1 for w in self.weights if w < 0)


def as_sequences(item: object, tokenizer: Tokenizer | None = None) -> list[TokenSequence]:
    """The sequences in ``item``: a TokenSequence, SFT Example / RenderedRow / CheckReport, an RL
    CapturedSequence / TokenCapture / ModelCall, a mapping with those fields, or an iterable of any of these."""
    if isinstance(item, TokenSequence):
        return [item]
    if hasattr(item, "samples") and hasattr(item, "rows_read"):  # CheckReport
        return [s for row in item.samples for s in as_sequences(row)]
    if hasattr(item, "examples") and hasattr(item, "row_number"):  # RenderedRow
        k = len(item.examples)
        return [
            _from_example(e, f" · example {i + 1}/{k}" if k > 1 else "") for i, e in enumerate(item.examples)
        ]
    if hasattr(item, "input_ids") and hasattr(item, "token_turns"):  # Example
        return [_from_example(cast("Example", item), "")]
    if hasattr(item, "sequences") and hasattr(item, "calls"):  # TokenCapture
        return [_sampled(s.tokens, s.sampled, f"sequence {i + 1}") for i, s in enumerate(item.sequences())]
    if hasattr(item, "tokens") and hasattr(item, "sampled"):  # CapturedSequence
        return [_sampled(item.tokens, item.sampled, "captured sequence")]
    if hasattr(item, "prompt_tokens") and hasattr(item, "completion_tokens"):  # ModelCall
        return [_call(item.prompt_tokens, item.completion_tokens, "model call")]
    if isinstance(item, Mapping):
        return [_from_mapping(item, tokenizer)]
    if isinstance(item, Iterable) and not isinstance(item, str | bytes):
        return [s for x in item for s in as_sequences(x, tokenizer)]
    raise TypeError(f"cannot preview a {type(item).__name__}")


def _from_example(example: Example, suffix: str) -> TokenSequence:
    turns = tuple(example.turn_indices)
    trains = f" · trains messages{list(turns)}" if turns else ""
    # The first token is never a target (nothing precedes it), so it is never shown as trained.
    weights = [0.0, *example.weights[1:]] if len(example.weights) else []
    turns_per_token = [-1, *example.token_turns[1:]] if len(example.token_turns) else []
    return TokenSequence(
        example.input_ids,
        weights,
        f"row {example.row_number}{suffix}{trains}",
        turns=turns_per_token,
        note=example.split_reason,
    )


def _sampled(
    tokens: Sequence[int], sampled: Sequence[bool], label: str, note: str | None = None
) -> TokenSequence:
    return TokenSequence(list(tokens), [1.0 if s else 0.0 for s in sampled], label, note=note)


def _call(
    prompt: Sequence[int], completion: Sequence[int], label: str, note: str | None = None
) -> TokenSequence:
    return _sampled([*prompt, *completion], [False] * len(prompt) + [True] * len(completion), label, note)


def _from_mapping(item: Mapping[str, Any], tokenizer: Tokenizer | None) -> TokenSequence:
    label = str(item.get("label", ""))
    if "weights" in item:
        ids = item.get("input_ids", item.get("tokens"))
        return TokenSequence(
            ids, item["weights"], label, **{k: item.get(k) for k in ("turns", "note", "text", "offsets")}
        )
    if "sampled" in item or "mask" in item:
        ids = item.get("tokens", item.get("input_ids"))
        return _sampled(ids, item.get("sampled", item.get("mask")), label or "sequence")
    if "completion_tokens" in item:
        if "prompt_tokens" in item:
            return _call(item["prompt_tokens"], item["completion_tokens"], label or "model call")
        if "prompt" in item and tokenizer is not None:
            # Transcripts keep the prompt as text: re-tokenizing it shows the context, not the exact ids sent.
            prompt = tokenizer.encode(item["prompt"], add_special_tokens=False)
            return _call(
                prompt,
                item["completion_tokens"],
                label or "model call",
                note="prompt re-tokenized from its text; the ids sent may differ",
            )
    raise TypeError(f"cannot preview a mapping with keys {sorted(item)}")
