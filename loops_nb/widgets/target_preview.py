"""Target previews: every token of a training sequence, coloured by its loss weight.

A preview answers "what exactly does this train on?" before any money is spent: the chat template's rendering,
which turns train, whether the stop token is trained, what the template writes after it. It takes anything
`as_sequences` does: SFT examples (their weights and per-token turns), RL captures (sampled tokens train, the
context does not) or a `TokenSequence`, duck-typed so that the widgets import neither recipe. HTML: one
inline-styled ``<span>`` per token, its id and weight on hover (nothing depends on ``<style>``, JS or
``data-*``, which untrusted notebooks drop); plain text brackets trained runs as ``[[…]]`` (``[[-…-]]``
negative ones).

Text is never decoded one token at a time: a character split over several byte-level tokens would turn into
U+FFFD. Tokens are decoded in context and grouped until their text is whole (a group shares one span), or, given
the sequence's text and character offsets, the text is sliced instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Protocol, cast

from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import GREY, MONOSPACE, UI, div, fmt, plural, tag

if TYPE_CHECKING:
    from loops_nb.sft.targets import Example

Decode = Callable[[list[int]], str]
"""Token ids to text, special tokens kept."""

_CONTEXT = 4  # tokens decoded before a token so that decoders that strip a leading space see its neighbours
_MAX_GROUP = 8  # a byte-level character needs at most 4 tokens; stop merging well after that
_SPAN = "outline:1px solid rgba(0,0,0,0.08);border-radius:2px"
_BOX = (
    f"font:12px/1.6 {MONOSPACE};white-space:pre-wrap;"
    "word-break:break-all;border:1px solid #d0d7de;border-radius:6px;padding:6px 8px;margin:2px 0 10px"
)


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


class TargetPreview(Widget):
    """Tokens of one or more sequences coloured by loss weight; each shows its first ``max_tokens`` tokens."""

    def __init__(
        self, examples: object, tokenizer: Tokenizer, max_tokens: int = 1000, *, max_sequences: int = 10
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        all_sequences = as_sequences(examples, tokenizer)
        self.sequences = all_sequences[:max_sequences]
        self.hidden_sequences = len(all_sequences) - len(self.sequences)
        self._pieces: dict[int, list[_Piece]] = {}

    @property
    def n_tokens(self) -> int:
        return sum(len(s.input_ids) for s in self.sequences)

    @property
    def n_trained(self) -> int:
        return sum(s.n_trained for s in self.sequences)

    def summary(self) -> str:
        return (
            f"TargetPreview({plural(len(self.sequences), 'sequence')}, {self.n_tokens} tokens, "
            f"{self.n_trained} trained, {self.n_tokens - self.n_trained} not trained)"
        )

    __repr__ = summary

    def pieces(self, index: int) -> list[_Piece]:
        """Sequence ``index`` (its shown tokens) as whole-character pieces."""
        if index not in self._pieces:
            seq = self.sequences[index]
            self._pieces[index] = _split(seq, self.tokenizer, min(len(seq.input_ids), self.max_tokens))
        return self._pieces[index]

    # -- text --------------------------------------------------------------------------------------------------

    def __str__(self) -> str:
        blocks = [self._text(i) for i in range(len(self.sequences))]
        if self.hidden_sequences:
            blocks.append(f"… {plural(self.hidden_sequences, 'more sequence')}")
        return "\n\n".join(blocks)

    def _text(self, index: int) -> str:
        seq = self.sequences[index]
        out = [self._header(seq) + "\n"]
        if seq.note:
            out.append(f"note: {seq.note}\n")
        open_run: tuple[int, int] | None = None  # (sign of the weight, turn) of the bracketed run
        for piece in self.pieces(index):
            sign = (piece.weight > 0) - (piece.weight < 0)
            if open_run is not None and (sign, piece.turn) != open_run:
                out.append("]]" if open_run[0] > 0 else "-]]")
                open_run = None
            if sign and open_run is None:
                out.append("[[" if sign > 0 else "[[-")
                open_run = (sign, piece.turn)
            out.append(piece.text)
        if open_run is not None:
            out.append("]]" if open_run[0] > 0 else "-]]")
        text = "".join(out)
        more = len(seq.input_ids) - min(len(seq.input_ids), self.max_tokens)
        if more:
            text += f"\n… {more} more tokens"
        return f"{text}\n({len(seq.input_ids)} tokens, {seq.n_trained} trained)"

    def _header(self, seq: TokenSequence) -> str:
        n, trained, negative = len(seq.input_ids), seq.n_trained, seq.n_negative
        parts = [f"{n} tokens", f"{trained} trained"]
        if negative:
            parts.append(f"{negative} negative")
        parts.append(f"{n - trained - negative} masked")
        label = f"{seq.label}: " if seq.label else ""
        return label + ", ".join(parts)

    # -- HTML --------------------------------------------------------------------------------------------------

    def to_html(self) -> str:
        colours = (
            ("trained", "background:rgba(46,160,67,0.75);"),
            ("negative", "background:rgba(218,54,51,0.75);"),
        )
        legend = " ".join(
            tag("span", f"&nbsp;{name}&nbsp;", f"{bg}{_SPAN}") for name, bg in (*colours, ("masked", ""))
        )
        hover = tag("span", "hover a token for its id and weight", f"color:{GREY}")
        out = [div(f"<b>{escape(self.summary())}</b> &nbsp; {legend} &nbsp; {hover}", "margin-bottom:4px")]
        out.extend(self._html(i) for i in range(len(self.sequences)))
        if self.hidden_sequences:
            out.append(div(f"… {plural(self.hidden_sequences, 'more sequence')}", f"color:{GREY}"))
        return div("".join(out), f"font:12px {UI};color:#1f2328")

    def _html(self, index: int) -> str:
        seq = self.sequences[index]
        head = [div(escape(self._header(seq)), "font-weight:600")]
        if seq.turns is not None:
            per_turn = Counter(t for t, w in zip(seq.turns, seq.weights, strict=True) if t >= 0 and w != 0)
            if per_turn:
                text = ", ".join(f"messages[{t}]: {k} tokens" for t, k in sorted(per_turn.items()))
                head.append(div(f"trained turns: {escape(text)}", "color:#57606a"))
        if seq.note:
            head.append(div(escape(seq.note), "color:#9a6700;font-style:italic"))
        spans = [self._span(p) for p in self.pieces(index)]
        more = len(seq.input_ids) - min(len(seq.input_ids), self.max_tokens)
        if more:
            hidden = seq.weights[self.max_tokens :]
            trained = sum(1 for w in hidden if w > 0)
            spans.append(tag("span", f" … {more} more tokens ({trained} trained)", f"color:{GREY}"))
        return "".join(head) + div("".join(spans), _BOX)

    def _span(self, piece: _Piece) -> str:
        w = piece.weight
        if w > 0:
            style = f"background:rgba(46,160,67,{0.25 + 0.5 * min(w, 1.0):.3f})"
        elif w < 0:
            style = f"background:rgba(218,54,51,{0.25 + 0.5 * min(-w, 1.0):.3f})"
        else:
            style = "background:transparent;color:#57606a"
        text = escape(piece.text) if piece.text else "∅"
        text = text.replace("\r", "␍").replace("\t", "→\t").replace("\n", "↵<br>")
        title = "&#10;".join(escape(t, quote=True) for t in piece.titles)
        return f'<span title="{title}" style="{style};{_SPAN}">{text}</span>'

    def plain_text(self) -> str:
        return str(self)


# -- pieces ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """Consecutive tokens whose text is whole characters (usually one token); coloured by the first."""

    text: str
    weight: float
    turn: int
    titles: tuple[str, ...]


def _split(seq: TokenSequence, tokenizer: Tokenizer, shown: int) -> list[_Piece]:
    ids = list(seq.input_ids[:shown])
    decode = _decoder(tokenizer)
    bounds = _by_offsets(seq, shown) if seq.text is not None and seq.offsets is not None else None
    if bounds is None:
        bounds = _by_decoding(ids, decode)
    turns = seq.turns if seq.turns is not None else [-1] * len(seq.input_ids)
    return [
        _Piece(
            text,
            float(seq.weights[a]),
            int(turns[a]),
            tuple(
                f"#{k} id={ids[k]} weight={fmt(float(seq.weights[k]))} {decode([ids[k]])!r}"
                + (f" (part of {text!r})" if b - a > 1 else "")
                + (f" (messages[{turns[k]}])" if turns[k] >= 0 else "")
                for k in range(a, b)
            ),
        )
        for a, b, text in bounds
    ]


def _by_decoding(ids: list[int], decode: Decode) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    i = 0
    while i < len(ids):
        context = ids[max(0, i - _CONTEXT) : i]
        base = decode(context)
        j = i + 1
        while True:
            full = decode(context + ids[i:j])
            text = full[len(base) :] if full.startswith(base) else decode(ids[i:j])
            if not text.endswith("\ufffd") or j >= len(ids) or j - i >= _MAX_GROUP:
                break
            j += 1
        out.append((i, j, text))
        i = j
    return out


def _by_offsets(seq: TokenSequence, shown: int) -> list[tuple[int, int, str]]:
    assert seq.text is not None and seq.offsets is not None
    groups: list[list[int]] = []  # [first token, last token + 1, char start, char end]
    for k in range(shown):
        start, end = seq.offsets[k]
        if groups and end > start and start < groups[-1][3]:  # tokens sharing a character: one piece
            groups[-1][1], groups[-1][3] = k + 1, max(end, groups[-1][3])
        else:
            groups.append([k, k + 1, start, end])
    # A piece's text runs from where the previous one ended, so characters that offsets leave out (trimmed
    # spaces) are still shown, with the token that follows them.
    out: list[tuple[int, int, str]] = []
    cursor = groups[0][2] if groups else 0
    for a, b, _, end in groups:
        out.append((a, b, seq.text[cursor : max(end, cursor)]))
        cursor = max(cursor, end)
    return out


def _decoder(tokenizer: Tokenizer) -> Decode:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust decoder: no clean-up of spaces, and much faster per call
        return lambda ids: backend.decode(list(ids), skip_special_tokens=False)

    def decode(ids: list[int]) -> str:
        text = tokenizer.decode(list(ids), skip_special_tokens=False)
        return text if isinstance(text, str) else "".join(text)  # one sequence decodes to one string

    return decode


# -- sequences from SFT examples and RL captures ------------------------------------------------------------


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
