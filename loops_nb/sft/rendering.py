"""The target rule: which tokens of a chat row train, decided by the trained model's own chat template.

Every trained assistant turn learns its own tokens *and its stop token* (``<|im_end|>``, ``<|eot_id|>``, ...),
in the context it was generated in. Everything else has weight 0: system, user and tool turns, the generation
prompt (``<|im_start|>assistant\\n``), and whatever the template writes after the stop token (the ``\\n`` after
``<|im_end|>``), because the model stops at its stop token and never generates what follows.

How a turn is located, for trained turn ``j``:

1. ``context = render(messages[:j], add_generation_prompt=True)`` is the prompt the model was given, and
   ``full = render(messages[:j+1])`` adds the turn. ``context`` must be a text prefix of ``full`` (else the
   generation prompt disagrees with the rendered turn and the row is refused); the turn is what follows, up to
   and including its first stop token.
2. Trained turns are grouped: one example can train several turns only if the latest one's render starts with
   each earlier turn's ``context + turn`` exactly. Templates that rewrite earlier turns (Qwen3 drops the
   ``<think>`` reasoning of turns before the last user query, and writes an empty ``<think></think>`` only on
   the last turn) break that, and the row is split into one example per context: no turn is trained in a context
   it never saw.
3. Each example's text is tokenized once, with offsets. Token-level prefix property: the tokens before a turn
   must be exactly the tokens of its context tokenized alone. Added tokens split text into independently
   tokenized pieces, so only the piece from the last added token before the turn needs re-tokenizing to check
   this; a turn that fails (a regex that splits ``\\n\\n`` differently at the end of a string) becomes its own
   example, built as ``tokens(context) + tokens(turn)``.

This costs two renders per trained turn and one tokenization per example (plus tiny pieces), not a
re-tokenization of every prefix.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2

from loops_nb.errors import ConfigError, RenderingError
from loops_nb.llm.templates import ChatTemplate
from loops_nb.sft.data import ChatRow, RefusedRow, Row, RowResult, TokenizedRow
from loops_nb.sft.refusal_wording import LENGTH_FIX
from loops_nb.sft.survival import check_context, check_trained_turn
from loops_nb.sft.tokenization import AddedTokenEncoder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.llm.renderer import Renderer as SamplingRenderer

# End-of-turn tokens of common chat formats; those the tokenizer has (plus its eos token) are the default stops.
KNOWN_STOP_TOKENS = (
    "<|im_end|>",  # ChatML: SmolLM2, Qwen
    "<|eot_id|>",  # Llama 3
    "<|eom_id|>",  # Llama 3.1 tool calls
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
)


def split_reason(who: str) -> str:
    """Why a row became one example per trained turn, `who` rendering it ("the chat template")."""
    return (
        f"{who} renders earlier turns differently once later turns follow (e.g. it drops their reasoning), so "
        "each trained turn is trained in its own example, in the context it was generated in"
    )


class Refusal(RenderingError):
    """A row that cannot train, and why (becomes its `RefusedRow`)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of tokens with the same role in an example, decoded for previews. ``turn`` is -1 when untrained."""

    text: str
    trained: bool
    turn: int


@dataclass(frozen=True, slots=True)
class Example:
    """One training sequence. ``turn_indices`` are the message indices it trains; ``token_turns`` gives, per
    token, the message index of the trained turn it belongs to (-1 for untrained tokens)."""

    input_ids: list[int]
    weights: list[float]
    row_number: int
    turn_indices: tuple[int, ...]
    token_turns: list[int]
    split_reason: str | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def n_trained(self) -> int:
        """Tokens that train: weighted positions after the first (a datum's targets are ``input_ids[1:]``)."""
        return sum(1 for w in self.weights[1:] if w > 0)

    def segments(self, tokenizer: PreTrainedTokenizerBase) -> list[Segment]:
        """The example as decoded runs of trained/untrained text, for previews."""
        out: list[Segment] = []
        start = 0
        for i in range(1, len(self.input_ids) + 1):
            if i == len(self.input_ids) or self._key(i) != self._key(start):
                text = tokenizer.decode(self.input_ids[start:i], skip_special_tokens=False)
                assert isinstance(text, str)  # a flat list of ids decodes to one string
                out.append(Segment(text, self.weights[start] > 0, self.token_turns[start]))
                start = i
        return out

    def _key(self, i: int) -> tuple[bool, int]:
        return self.weights[i] > 0, self.token_turns[i]


@dataclass(frozen=True, slots=True)
class RenderedRow:
    """A row that trains: its examples (more than one when the row is split), and why it was split."""

    row_number: int
    examples: list[Example]
    split_reason: str | None = None

    @property
    def n_tokens(self) -> int:
        return sum(e.n_tokens for e in self.examples)

    @property
    def n_trained(self) -> int:
        return sum(e.n_trained for e in self.examples)


RenderResult = RenderedRow | RefusedRow


def build_example(
    ids: list[int],
    weights: list[float],
    row_number: int,
    turn_indices: tuple[int, ...],
    token_turns: list[int],
    split_reason: str | None = None,
) -> Example:
    """An example as it trains, or a refusal when nothing in it can.

    The first token is never a target (a datum predicts ``input_ids[1:]`` from the tokens before them), so its
    weight is cleared here: the example's weights, its counts in `check`, its preview and the trainer's datum
    then all say the same thing.
    """
    if not any(weights[1:]):
        at = f"messages[{turn_indices[0]}]: the turn" if turn_indices else "the row"
        raise Refusal(
            f"{at} trains only the first token of its example, and the first token can never train (its loss "
            f"needs a token before it); put the context it follows before it"
        )
    if weights[0]:
        weights = [0.0, *weights[1:]]
        token_turns = [-1, *token_turns[1:]]
    return Example(ids, weights, row_number, turn_indices, token_turns, split_reason)


@dataclass(slots=True)
class _Turn:
    index: int
    text: str  # context + turn, through the stop token
    start: int  # where the generated turn begins (= len(context))
    stop_start: int


def default_stop_tokens(tokenizer: PreTrainedTokenizerBase, template: str | None = None) -> list[str]:
    """The tokenizer's eos token plus the known end-of-turn tokens it has as added tokens and `template`
    (the chat template's source, with and without tools) writes. A token the template never writes ends no
    turn, and as a stop it would also refuse every row whose text holds it (Gemma's vocabulary has `</s>`,
    which an HTML answer may well contain). Without a template, every known one the tokenizer has."""
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    stops = [tokenizer.eos_token] if tokenizer.eos_token in added else []
    return stops + [
        t for t in KNOWN_STOP_TOKENS if t in added and t not in stops and (template is None or t in template)
    ]


def turn_groups(rendered: Mapping[int, Sequence[Any]]) -> list[list[int]]:
    """Trained turns (by message index, each rendered through its stop token: text or token ids) grouped into
    examples: from the latest back, a turn joins a group when the group's rendering starts with its own."""
    pending = sorted(rendered, reverse=True)
    groups: list[list[int]] = []
    while pending:
        base = rendered[pending[0]]
        members = [j for j in pending if base[: len(rendered[j])] == rendered[j]]
        pending = [j for j in pending if j not in members]
        groups.append(sorted(members))
    groups.reverse()
    return groups


def alternation(tokens: Iterable[str]) -> re.Pattern[str]:
    longest_first = sorted(set(tokens), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, longest_first)) or "(?!)")


class RowRenderer:
    """What every SFT renderer shares: rows in, examples (or a refusal with the reason) out.

    Tokenized rows train as given; chat rows go through `_chat`, the target rule of the renderer at hand (a chat
    template here, a family's renderer in family_targets.py). Subclasses set `tokenizer`, `stop_tokens`,
    `max_seq_len`, `vocab_size` and `_special_re` (the control tokens a row's text may not hold).
    """

    tokenizer: PreTrainedTokenizerBase
    stop_tokens: list[str]
    max_seq_len: int | None
    vocab_size: int
    _special_re: re.Pattern[str]

    def render(self, row: Row) -> RenderResult:
        """Examples for one row, or a `RefusedRow` saying why it cannot train."""
        try:
            if isinstance(row, TokenizedRow):
                return self._tokenized(row)
            return self._chat(row)
        except Refusal as refusal:
            return RefusedRow(row.row_number, str(refusal))

    def render_rows(self, rows: Iterable[RowResult]) -> Iterator[RenderResult]:
        """Render a stream of rows (e.g. from `read_rows`), passing refusals through."""
        for row in rows:
            yield row if isinstance(row, RefusedRow) else self.render(row)

    def examples(self, rows: Iterable[RowResult]) -> Iterator[Example]:
        """Only the training examples of a stream of rows."""
        for result in self.render_rows(rows):
            if isinstance(result, RenderedRow):
                yield from result.examples

    def sampling_renderer(self) -> SamplingRenderer:
        """The `loops_nb.llm` renderer that renders prompts as this trains them (compare, the preflight)."""
        raise NotImplementedError

    def _chat(self, row: ChatRow) -> RenderedRow:
        raise NotImplementedError

    def _tokenized(self, row: TokenizedRow) -> RenderedRow:
        for i, tid in enumerate(row.input_ids):
            if tid >= self.vocab_size:
                raise Refusal(
                    f"input_ids[{i}]: token id {tid} is outside the tokenizer's vocabulary ({self.vocab_size} ids)"
                )
        self._check_length(len(row.input_ids), "the row")
        example = build_example(
            list(row.input_ids), list(row.weights), row.row_number, (), [-1] * len(row.input_ids)
        )
        return RenderedRow(row.row_number, [example])

    def _check_special_tokens(self, row: ChatRow) -> None:
        for i, m in enumerate(row.messages):
            fields = {"content": m.content, "reasoning_content": m.reasoning_content}
            for k, call in enumerate(m.tool_calls or ()):
                fields[f"tool_calls[{k}]"] = call.function.model_dump_json()
            for name, text in fields.items():
                found = self._special_re.search(text) if text else None
                if found:
                    raise Refusal(
                        f"messages[{i}].{name}: contains the special token {found.group(0)!r}, which the tokenizer "
                        f"would read as a control token, not text"
                    )

    def _check_length(self, n: int, what: str) -> None:
        if self.max_seq_len is not None and n > self.max_seq_len:
            raise Refusal(
                f"{what} is {n:,} tokens, longer than max_seq_len {self.max_seq_len:,} (rows are refused, never "
                f"truncated: a cut turn would teach the model to stop mid-answer or never stop); {LENGTH_FIX}"
            )


class Renderer(RowRenderer):
    """Renders validated rows into training examples by the chat template, or refuses them with the reason.

    ``chat_template`` overrides the tokenizer's own (e.g. `TOOL_CAPABLE_CHATML_TEMPLATE` for SmolLM2 tool use).
    ``stop_tokens`` are the tokens that end a generated turn; by default the eos token and the known end-of-turn
    tokens the tokenizer has and the template writes. ``template_variables`` are passed to the template (e.g. ``enable_thinking``).
    Examples longer than ``max_seq_len`` tokens are refused, never truncated.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        max_seq_len: int | None = None,
        stop_tokens: Sequence[str] | None = None,
        template_variables: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise ConfigError(
                f"{type(tokenizer).__name__} is not a fast (Rust) tokenizer; SFT rendering needs one"
            )
        self.template = ChatTemplate(tokenizer, chat_template, template_variables)
        self._chat_template = chat_template
        self.max_seq_len = max_seq_len
        added = tokenizer.added_tokens_decoder
        added_by_text = {t.content: i for i, t in added.items()}
        if stop_tokens is None:
            written = f"{self.template.source}\n{self.template.source_with_tools}"
            stop_tokens = default_stop_tokens(tokenizer, written)
        self.stop_tokens = list(stop_tokens)
        if not self.stop_tokens:
            raise ConfigError("the tokenizer has no eos or end-of-turn token; set the stop tokens explicitly")
        for tok in self.stop_tokens:
            if tok not in added_by_text:
                raise ConfigError(f"stop token {tok!r} is not a special/added token of this tokenizer")
        self._stop_ids = {added_by_text[t] for t in self.stop_tokens}
        self._stop_re = alternation(self.stop_tokens)
        self._encoder = AddedTokenEncoder(tokenizer, self._stop_re)
        self._special_re = alternation([*tokenizer.all_special_tokens, *self.stop_tokens])
        self.vocab_size = len(tokenizer)

    def sampling_renderer(self) -> SamplingRenderer:
        from loops_nb.llm.renderer import ChatRenderer

        return ChatRenderer(self.tokenizer, self._chat_template)

    # -- chat rows -----------------------------------------------------------------------------------------------

    def _chat(self, row: ChatRow) -> RenderedRow:
        self._check_special_tokens(row)
        messages, tools = row.template_messages(), row.template_tools()
        turns = {j: self._locate_turn(row, messages, tools, j) for j in row.trained_turns}

        groups = turn_groups({j: turn.text for j, turn in turns.items()})

        split_reasons = [split_reason("the chat template")] if len(groups) > 1 else []
        built: list[tuple[list[int], list[float], list[int], tuple[int, ...]]] = []
        all_failed: list[int] = []
        for members in groups:
            base = turns[members[-1]].text
            reason = check_context(row, members[-1], set(members), base)
            if reason:
                raise Refusal(reason)
            ok, failed = self._tokenize_group(base, [turns[j] for j in members])
            if ok:
                built.append(ok)
            for j in failed:
                built.append(self._standalone(turns[j]))
            all_failed.extend(failed)

        if all_failed:
            at = ", ".join(f"messages[{j}]" for j in all_failed)
            split_reasons.append(
                f"{at}: the context tokenizes differently inside the conversation than on its own, so each such "
                f"turn is trained in its own example, on exactly the tokens it was prompted with"
            )
        why = "; ".join(split_reasons) if len(built) > 1 else None
        built.sort(key=lambda b: b[3])
        examples = []
        for ids, weights, token_turns, indices in built:
            what = "the conversation" if len(built) == 1 else f"the example ending at messages[{indices[-1]}]"
            self._check_length(len(ids), what)
            examples.append(build_example(ids, weights, row.row_number, indices, token_turns, why))
        return RenderedRow(row.row_number, examples, why)

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, j: int, *, prompt: bool
    ) -> str:
        try:
            return self.template.render(messages, tools, add_generation_prompt=prompt)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            upto = f"messages[:{j}] with the generation prompt" if prompt else f"messages[:{j + 1}]"
            # The error text may quote the row (a KeyError repeats the key): keep it to one short line.
            error = " ".join(str(exc).split())
            error = error if len(error) <= 200 else f"{error[:200]}..."
            raise Refusal(f"messages[{j}]: the chat template failed to render {upto}: {error}") from None

    def _locate_turn(
        self, row: ChatRow, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, j: int
    ) -> _Turn:
        if j == 0:
            raise Refusal(
                "messages[0]: a trained assistant turn cannot open the conversation (there is no prompt it was "
                "generated from); add the turn it answers, or give it weight 0"
            )
        context = self._render(messages[:j], tools, j, prompt=True)
        full = self._render(messages[: j + 1], tools, j, prompt=False)
        if not full.startswith(context):
            common = next(
                (i for i, (a, b) in enumerate(zip(context, full, strict=False)) if a != b), len(full)
            )
            raise Refusal(
                f"messages[{j}]: the chat template's generation prompt does not match how it renders the turn "
                f"(prompt has {context[common : common + 30]!r} where the turn has {full[common : common + 30]!r}), "
                f"so the generated tokens cannot be located"
            )
        stop = self._stop_re.search(full, len(context))
        if stop is None:
            raise Refusal(
                f"messages[{j}]: the rendered turn has no stop token (looked for {', '.join(self.stop_tokens)}); "
                f"the model could never learn to end it"
            )
        reason = check_trained_turn(j, row.messages[j], full[len(context) : stop.end()])
        if reason:
            raise Refusal(reason)
        return _Turn(j, full[: stop.end()], len(context), stop.start())

    def _tokenize_group(
        self, base: str, turns: list[_Turn]
    ) -> tuple[tuple[list[int], list[float], list[int], tuple[int, ...]] | None, list[int]]:
        """Tokenize ``base`` once and mark each turn's tokens; turns whose context does not tokenize as a prefix
        are returned as failed (to be trained on their own)."""
        ids, added = self._encoder.encode(base)
        added_ends = [end for _, _, end in added]
        start_of = {start: i for i, start, _ in added}

        pieces, anchors = [], []
        for turn in turns:
            k = bisect.bisect_right(added_ends, turn.start) - 1
            anchor, char = added[k][:2] if k >= 0 else (0, 0)
            anchors.append(anchor)
            pieces.append(base[char : turn.start])
        piece_ids = self._encode_many(pieces)

        spans: list[tuple[int, int, int]] = []
        failed: list[int] = []
        for turn, anchor, expected in zip(turns, anchors, piece_ids, strict=True):
            first = anchor + len(expected)
            stop = start_of.get(turn.stop_start)
            if (
                ids[anchor:first] != expected
                or stop is None
                or ids[stop] not in self._stop_ids
                or stop < first
            ):
                failed.append(turn.index)
            else:
                spans.append((turn.index, first, stop + 1))
        if not spans:
            return None, failed
        end = max(s[2] for s in spans)
        weights = [0.0] * end
        token_turns = [-1] * end
        for index, first, stop_end in spans:
            weights[first:stop_end] = [1.0] * (stop_end - first)
            token_turns[first:stop_end] = [index] * (stop_end - first)
        return (ids[:end], weights, token_turns, tuple(s[0] for s in spans)), failed

    def _standalone(self, turn: _Turn) -> tuple[list[int], list[float], list[int], tuple[int, ...]]:
        context_ids, turn_ids = self._encode_many([turn.text[: turn.start], turn.text[turn.start :]])
        n = len(turn_ids)
        return (
            context_ids + turn_ids,
            [0.0] * len(context_ids) + [1.0] * n,
            [-1] * len(context_ids) + [turn.index] * n,
            (turn.index,),
        )

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        # One call per text, not encode_batch: these are a few short pieces, and waking the batch thread pool
        # costs more than encoding them.
        return [self._encoder.encode_ids(text) for text in texts]
