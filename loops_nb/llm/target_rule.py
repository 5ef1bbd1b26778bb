"""The supervised target rule that every renderer implements (`Renderer.supervised_examples`): which tokens of
a conversation train (docs/reference/sft.md, "The target rule"), its shared pieces, and its implementation on
a chat template's text (`ChatTemplateTargets`); a family renderer's is `PrimeRenderer.supervised_examples`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jinja2

from loops_nb.errors import ConfigError, RenderingError
from loops_nb.llm.added_token_encoder import AddedTokenEncoder, alternation
from loops_nb.llm.chat_messages import ChatMessage, ToolSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.llm.templates import ChatTemplate

END_OF_TURN_TOKENS = (
    "<|im_end|>",  # ChatML: SmolLM2, Qwen
    "<|eot_id|>",  # Llama 3
    "<|eom_id|>",  # Llama 3.1 tool calls
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
    "<|endoftext|>",
)
"""Tokens that end an assistant turn in common chat templates; those in the vocabulary stop sampling
(`ChatRenderer`)."""

KNOWN_STOP_TOKENS = (*END_OF_TURN_TOKENS, "<|end_of_text|>", "</s>")
"""End-of-turn tokens of common chat formats; those the tokenizer has (plus its eos token) and the template
writes are the chat template's target stops."""


class Refusal(RenderingError):
    """A row that cannot train, and why (becomes its `RefusedRow`)."""


class TargetChecks(Protocol):
    """What the caller checks survived the rendering (SFT: every message, call and tool of the row)."""

    def turn(self, j: int, text: str) -> str | None:
        """Why trained turn `j`, rendered as `text` (through its stop token), lost what the row says; None if not."""
        ...

    def context(self, last: int, members: set[int], text: str) -> str | None:
        """Why the example ending at turn `last` (training `members`), rendered as `text`, lost a message or a
        tool of the row; None if not."""
        ...


@dataclass(frozen=True, slots=True)
class SupervisedExample:
    """One training sequence as a renderer writes it: ``token_turns`` gives, per token, the message index of the
    trained turn it belongs to (-1 for untrained tokens); ``turn_indices`` are the turns it trains."""

    input_ids: list[int]
    weights: list[float]
    token_turns: list[int]
    turn_indices: tuple[int, ...]


def weighted_example(ids: list[int], spans: Sequence[tuple[int, int, int]]) -> SupervisedExample:
    """`ids` training, for each ``(turn, start, end)`` of `spans`, tokens ``start:end`` as that turn's."""
    weights, token_turns = [0.0] * len(ids), [-1] * len(ids)
    for turn, start, end in spans:
        weights[start:end] = [1.0] * (end - start)
        token_turns[start:end] = [turn] * (end - start)
    return SupervisedExample(ids, weights, token_turns, tuple(turn for turn, _, _ in spans))


@dataclass(frozen=True, slots=True)
class SupervisedExamples:
    """A conversation's examples, in turn order, and why it became more than one (None when it did not)."""

    examples: list[SupervisedExample]
    split_reason: str | None


def split_reason(who: str) -> str:
    """Why a row became one example per trained turn, `who` rendering it ("the chat template")."""
    return (
        f"{who} renders earlier turns differently once later turns follow (e.g. it drops their reasoning), so "
        "each trained turn is trained in its own example, in the context it was generated in"
    )


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


def opening_turn(j: int) -> None:
    if j == 0:
        raise Refusal(
            "messages[0]: a trained assistant turn cannot open the conversation (there is no prompt it was "
            "generated from); add the turn it answers, or give it weight 0"
        )


def render_failed(who: str, exc: BaseException, j: int, upto: str) -> Refusal:
    # The error text may quote the row (a KeyError repeats the key): keep it to one short line.
    error = " ".join(str(exc).split()) or type(exc).__name__
    error = error if len(error) <= 200 else f"{error[:200]}..."
    return Refusal(f"messages[{j}]: {who} failed to render {upto}: {error}")


def default_stop_tokens(tokenizer: PreTrainedTokenizerBase, template: str) -> list[str]:
    """The tokenizer's eos token plus the known end-of-turn tokens it has as added tokens and `template`
    (the chat template's source, with and without tools) writes. A token the template never writes ends no
    turn, and as a stop it would also refuse every row whose text holds it (Gemma's vocabulary has `</s>`,
    which an HTML answer may well contain)."""
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    stops = [tokenizer.eos_token] if tokenizer.eos_token in added else []
    return stops + [t for t in KNOWN_STOP_TOKENS if t in added and t not in stops and t in template]


@dataclass(slots=True)
class _Turn:
    index: int
    text: str  # context + turn, through the stop token
    start: int  # where the generated turn begins (= len(context))
    stop_start: int


class ChatTemplateTargets:
    """The target rule on a chat template's text (docs/reference/sft.md, "Locating a turn"): each trained turn
    located between its generation prompt and its first stop token, turns grouped (`turn_groups`) on that text,
    each example tokenized once and each turn's context checked to tokenize as a prefix, re-tokenizing only the
    piece after the last added token before it; a turn that fails is its own example.

    This costs two renders per trained turn and one tokenization per example (plus tiny pieces), not a
    re-tokenization of every prefix. ``stop_tokens``: the tokens that end a generated turn; by default the eos
    token and the known end-of-turn tokens the tokenizer has and the template writes.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: ChatTemplate,
        stop_tokens: Sequence[str] | None = None,
    ) -> None:
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise ConfigError(
                f"{type(tokenizer).__name__} is not a fast (Rust) tokenizer; SFT rendering needs one"
            )
        self.template = template
        added_by_text = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
        if stop_tokens is None:
            stop_tokens = default_stop_tokens(tokenizer, f"{template.source}\n{template.source_with_tools}")
        self.stop_tokens = list(stop_tokens)
        if not self.stop_tokens:
            raise ConfigError("the tokenizer has no eos or end-of-turn token; set the stop tokens explicitly")
        for tok in self.stop_tokens:
            if tok not in added_by_text:
                raise ConfigError(f"stop token {tok!r} is not a special/added token of this tokenizer")
        self._stop_ids = {added_by_text[t] for t in self.stop_tokens}
        self._stop_re = alternation(self.stop_tokens)
        self._encoder = AddedTokenEncoder(tokenizer, self._stop_re)

    def examples(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None,
        trained_turns: Sequence[int],
        checks: TargetChecks | None,
    ) -> SupervisedExamples:
        turns = {j: self._locate_turn(messages, tools, j, checks) for j in trained_turns}
        groups = turn_groups({j: turn.text for j, turn in turns.items()})

        split_reasons = [split_reason("the chat template")] if len(groups) > 1 else []
        built: list[SupervisedExample] = []
        all_failed: list[int] = []
        for members in groups:
            base = turns[members[-1]].text
            reason = checks and checks.context(members[-1], set(members), base)
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
        built.sort(key=lambda b: b.turn_indices)
        return SupervisedExamples(built, "; ".join(split_reasons) if len(built) > 1 else None)

    def _render(
        self, messages: list[ChatMessage], tools: list[ToolSpec] | None, j: int, *, prompt: bool
    ) -> str:
        try:
            return self.template.render(messages, tools, add_generation_prompt=prompt)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            upto = f"messages[:{j}] with the generation prompt" if prompt else f"messages[:{j + 1}]"
            raise render_failed("the chat template", exc, j, upto) from None

    def _locate_turn(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None,
        j: int,
        checks: TargetChecks | None,
    ) -> _Turn:
        opening_turn(j)
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
        reason = checks and checks.turn(j, full[len(context) : stop.end()])
        if reason:
            raise Refusal(reason)
        return _Turn(j, full[: stop.end()], len(context), stop.start())

    def _tokenize_group(self, base: str, turns: list[_Turn]) -> tuple[SupervisedExample | None, list[int]]:
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
        return weighted_example(ids[: max(s[2] for s in spans)], spans), failed

    def _standalone(self, turn: _Turn) -> SupervisedExample:
        context_ids, turn_ids = self._encode_many([turn.text[: turn.start], turn.text[turn.start :]])
        ids = context_ids + turn_ids
        return weighted_example(ids, [(turn.index, len(context_ids), len(ids))])

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        # One call per text, not encode_batch: these are a few short pieces, and waking the batch thread pool
        # costs more than encoding them.
        return [self._encoder.encode_ids(text) for text in texts]
