"""SFT rows into training examples through the model's renderer (`SFTTargets`), or refusals with the reason.

The target rule itself (which tokens of a conversation train) is the renderer's: `Renderer.supervised_examples`
(llm/target_rule.py), the same object that renders the sampler's prompts, so SFT trains what RL samples,
token for token. Here: tokenized rows, which train as given; a row's text holding a control token; what the
row says surviving the rendering (survival.py); length (rows are refused, never truncated); the first token,
which can never train.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.llm.added_token_encoder import alternation
from loops_nb.llm.chat_messages import ChatMessage, ToolSpec, has_images
from loops_nb.llm.model_input import PromptImage
from loops_nb.llm.target_rule import Refusal
from loops_nb.sft.data import ChatRow, RefusedRow, RowResult, TokenizedRow
from loops_nb.sft.refusal_wording import FIRST_TOKEN, LENGTH_FIX
from loops_nb.sft.survival import CHAT_TEMPLATE_WORDING, RowChecks, family_wording

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.config.sections import ModelConfig
    from loops_nb.llm.renderer import Renderer
    from loops_nb.llm.renderer_choice import RendererChoice


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
    images: tuple[PromptImage, ...] = ()
    """The images among ``input_ids`` (a row with images), each at its run of image tokens."""

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
        keys = zip((w > 0 for w in self.weights), self.token_turns, strict=True)
        for (trained, turn), run in itertools.groupby(keys):
            end = start + sum(1 for _ in run)
            text = tokenizer.decode(self.input_ids[start:end], skip_special_tokens=False)
            assert isinstance(text, str)  # a flat list of ids decodes to one string
            out.append(Segment(text, trained, turn))
            start = end
        return out


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
    images: tuple[PromptImage, ...] = (),
) -> Example:
    """An example as it trains, or a refusal when nothing in it can.

    The first token is never a target (a datum predicts ``input_ids[1:]`` from the tokens before them), so its
    weight is cleared here: the example's weights, its counts in `check`, its preview and the trainer's datum
    then all say the same thing.
    """
    if not any(weights[1:]):
        at = f"messages[{turn_indices[0]}]: the turn" if turn_indices else "the row"
        raise Refusal(f"{at} trains only the first token of its example, and {FIRST_TOKEN}")
    if weights[0]:
        weights = [0.0, *weights[1:]]
        token_turns = [-1, *token_turns[1:]]
    return Example(ids, weights, row_number, turn_indices, token_turns, split_reason, images)


class SFTTargets:
    """Rows into training examples through `renderer` (a `ChatRenderer`, or a family's `PrimeRenderer`), or a
    `RefusedRow` saying why a row cannot train. Examples longer than ``max_seq_len`` tokens are refused, never
    truncated. `ConfigError` when the renderer cannot train (a slow tokenizer, a stop token it lacks)."""

    def __init__(self, renderer: Renderer, *, max_seq_len: int | None = None) -> None:
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.max_seq_len = max_seq_len
        self.vocab_size = len(self.tokenizer)
        self.stop_tokens = renderer.target_stop_tokens()
        self._special_re = alternation([*self.tokenizer.all_special_tokens, *self.stop_tokens])
        config = getattr(renderer, "config", None)
        self._wording = (
            CHAT_TEMPLATE_WORDING
            if config is None
            else family_wording(renderer.name, type(config).model_fields)
        )

    def render(self, row: RowResult) -> RenderResult:
        """Examples for one row, or a `RefusedRow` saying why it cannot train (a row refused as it was read
        passes through)."""
        if isinstance(row, RefusedRow):
            return row
        try:
            if isinstance(row, TokenizedRow):
                return self._tokenized(row)
            return self._chat(row)
        except Refusal as refusal:
            return RefusedRow(row.row_number, str(refusal))

    def render_rows(self, rows: Iterable[RowResult]) -> Iterator[RenderResult]:
        """Render a stream of rows (e.g. from `read_rows`), passing refusals through."""
        return map(self.render, rows)

    def examples(self, rows: Iterable[RowResult]) -> Iterator[Example]:
        """Only the training examples of a stream of rows."""
        for result in self.render_rows(rows):
            if isinstance(result, RenderedRow):
                yield from result.examples

    def _chat(self, row: ChatRow) -> RenderedRow:
        self._check_special_tokens(row)
        messages, tools = row.template_messages(), row.template_tools()
        try:
            found = self.renderer.supervised_examples(
                messages, tools, row.trained_turns, RowChecks(row, self._wording)
            )
        except UserError as exc:  # an image the renderer cannot read or render
            raise Refusal(str(exc)) from None
        built, why = found.examples, found.split_reason
        examples = []
        for ex in built:
            what = (
                "the conversation"
                if len(built) == 1
                else f"the example ending at messages[{ex.turn_indices[-1]}]"
            )
            self._check_length(len(ex.input_ids), what)
            images = (
                self._images(messages[: ex.turn_indices[-1]], tools, ex.input_ids)
                if has_images(messages)
                else ()
            )
            examples.append(
                build_example(
                    ex.input_ids, ex.weights, row.row_number, ex.turn_indices, ex.token_turns, why, images
                )
            )
        return RenderedRow(row.row_number, examples, why)

    def _images(
        self, context: list[ChatMessage], tools: list[ToolSpec] | None, ids: list[int]
    ) -> tuple[PromptImage, ...]:
        """The images of an example: those of the prompt its last turn is sampled from, which it starts with
        (images sit in user turns, so all of them are in that prompt)."""
        prompt, images = self.renderer.render_prompt(context, tools)
        assert ids[: len(prompt)] == prompt  # the target rule's context is this prompt
        return tuple(images)

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
            fields = {"content": m.text, "reasoning_content": m.reasoning_content}
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


def chat_targets(
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template: str | None = None,
    max_seq_len: int | None = None,
    stop_tokens: Sequence[str] | None = None,
    template_variables: Mapping[str, Any] | None = None,
) -> SFTTargets:
    """`SFTTargets` through the tokenizer's chat template (or `chat_template`): see `ChatRenderer`."""
    from loops_nb.llm.renderer import ChatRenderer

    renderer = ChatRenderer(
        tokenizer, chat_template, template_variables=template_variables, stop_tokens=stop_tokens
    )
    return SFTTargets(renderer, max_seq_len=max_seq_len)


def sft_targets(model: ModelConfig, tokenizer: Any, choice: RendererChoice | None = None) -> SFTTargets:
    """What SFT trains `model` through: the family's renderer where `[model] renderer` gives one (as RL and
    sampling render), else the chat template. `choice`: the renderer a run recorded (a resume and `compare`
    keep it, `model_renderer.run_renderer_choice`); default: what `[model]` resolves to now."""
    from loops_nb.model_renderer import model_renderer_choice, text_renderer

    choice = choice or model_renderer_choice(model)
    return SFTTargets(text_renderer(model, tokenizer, choice), max_seq_len=model.max_seq_len)
