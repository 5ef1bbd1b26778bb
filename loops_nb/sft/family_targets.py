"""The target rule through a model family's own renderer (`renderers`): what SFT trains on Qwen3, Llama 3,
DeepSeek, gpt-oss, ... when `[model] renderer` names (or `auto` finds) the family's renderer.

The rule is the chat template's (rendering.py), in token ids instead of text: a trained assistant turn learns
exactly what the model generates after the family's generation prompt, through its stop token, in the context
it was generated in. So SFT trains what RL samples, token for token.

For trained turn ``j``:

1. ``context`` = the family's generation prompt after ``messages[:j]``: the prompt the sampler gets.
2. The turn's own tokens = how the family writes ``messages[j]`` after that prompt, through the first stop
   token. They are rendered with the family's renderer set to keep the turn's reasoning
   (`renderer_choice.reasoning_kept`): gpt-oss drops a final answer's analysis from any rendered history, and
   Qwen3.6's default render of a lone turn keeps it; the generation prompt is the same either way, so the
   tokens are the ones the model writes there (Qwen3.6's prompt opens ``<think>\\n``: the turn starts inside
   it; gpt-oss's opens the analysis channel: the turn is the analysis, then the final or commentary message).
3. Turns are grouped into one example when the latest one's tokens start with each earlier turn's context +
   turn exactly (turn_groups); a family that drops earlier reasoning at a new user message (Qwen3) splits the
   row, so no turn is trained in a context it never saw.
4. Everything the row says must survive (survival.py, on the decoded tokens): a reasoning the family does not
   write in the configured mode (DeepSeek V4 chat mode) refuses the row, naming `[model] renderer_options`.

`renderers`' own `build_training_sample` marks trainable what its renderer calls sampled, over one render of
the whole conversation: on Qwen3.6 that includes the ``<think>\\n`` the prompt already holds, on gpt-oss it leaves
out the channel headers the model writes, and earlier turns train in the history the last one sees (without
their reasoning). This rule trains what the sampler's prompt is followed by, as the chat template's does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from loops_nb.sft.data import ChatRow
from loops_nb.sft.rendering import (
    Refusal,
    RenderedRow,
    RowRenderer,
    alternation,
    build_example,
    split_reason,
    turn_groups,
)
from loops_nb.sft.survival import check_context, check_trained_turn, family_wording

if TYPE_CHECKING:
    from loops_nb.config.sections import ModelConfig
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.renderer import Renderer as SamplingRenderer
    from loops_nb.llm.renderer_choice import RendererChoice


class FamilyTargets(RowRenderer):
    """Rows into training examples through `renderer` (a family's `PrimeRenderer`), or refusals with the reason.
    Examples longer than ``max_seq_len`` tokens are refused, never truncated."""

    def __init__(self, renderer: PrimeRenderer, *, max_seq_len: int | None = None) -> None:
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.max_seq_len = max_seq_len
        self.vocab_size = len(self.tokenizer)
        self._stop_ids = set(renderer.stop_token_ids)
        self.stop_tokens = [str(self.tokenizer.convert_ids_to_tokens(i)) for i in renderer.stop_token_ids]
        self._special_re = alternation([*self.tokenizer.all_special_tokens, *self.stop_tokens])
        self._wording = family_wording(renderer.name, type(renderer.config).model_fields)

    def sampling_renderer(self) -> SamplingRenderer:
        return self.renderer

    def _chat(self, row: ChatRow) -> RenderedRow:
        from loops_nb.llm.prime_renderer import to_prime_messages

        self._check_special_tokens(row)
        messages, tools = to_prime_messages(row.template_messages()), row.template_tools()
        turns = {j: self._locate_turn(row, messages, tools, j) for j in row.trained_turns}
        groups = turn_groups({j: ids for j, (ids, _) in turns.items()})
        why = split_reason(f"the {self.renderer.name} renderer") if len(groups) > 1 else None
        examples = []
        for members in groups:
            ids = turns[members[-1]][0]
            reason = check_context(row, members[-1], set(members), self._decode(ids), self._wording)
            if reason:
                raise Refusal(reason)
            weights, token_turns = [0.0] * len(ids), [-1] * len(ids)
            for j in members:
                end, start = len(turns[j][0]), turns[j][1]
                weights[start:end] = [1.0] * (end - start)
                token_turns[start:end] = [j] * (end - start)
            what = (
                "the conversation" if len(groups) == 1 else f"the example ending at messages[{members[-1]}]"
            )
            self._check_length(len(ids), what)
            examples.append(build_example(ids, weights, row.row_number, tuple(members), token_turns, why))
        return RenderedRow(row.row_number, examples, why)

    def _locate_turn(
        self, row: ChatRow, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, j: int
    ) -> tuple[list[int], int]:
        """Turn `j` as (its context and own tokens through the stop token, where its own tokens start)."""
        if j == 0:
            raise Refusal(
                "messages[0]: a trained assistant turn cannot open the conversation (there is no prompt it was "
                "generated from); add the turn it answers, or give it weight 0"
            )
        context = self._render(messages[:j], tools, j)
        own = self._reply(messages[: j + 1], tools, row, j)
        stop = next((k for k, t in enumerate(own) if t in self._stop_ids), None)
        if stop is None:
            raise Refusal(
                f"messages[{j}]: the {self.renderer.name} renderer ends this turn with no stop token (looked for "
                f"{', '.join(self.stop_tokens)}); the model could never learn to end it"
            )
        own = own[: stop + 1]
        reason = check_trained_turn(j, row.messages[j], self._decode(own), self._wording)
        if reason:
            raise Refusal(reason)
        return context + own, len(context)

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, j: int
    ) -> list[int]:
        try:
            return list(self.renderer.prime.render_ids(messages, tools=tools, add_generation_prompt=True))
        except Exception as exc:  # the family's renderer raises whatever its format refuses
            raise self._failed(exc, j, f"messages[:{j}] with the generation prompt") from None

    def _reply(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, row: ChatRow, j: int
    ) -> list[int]:
        from loops_nb.llm.prime_renderer import TurnNotAfterPrompt

        try:
            return self.renderer.reply_tokens_converted(messages, tools)
        except TurnNotAfterPrompt as exc:
            hint = (
                ""
                if row.messages[j].reasoning_content
                else "; the prompt opens the turn's reasoning: give the turn a reasoning_content"
            )
            raise Refusal(
                f"messages[{j}]: the {self.renderer.name} renderer writes this turn unlike its generation prompt "
                f"({exc}), so the generated tokens cannot be located{hint}"
            ) from None
        except Exception as exc:
            raise self._failed(exc, j, f"messages[:{j + 1}]") from None

    def _failed(self, exc: Exception, j: int, upto: str) -> Refusal:
        error = re.sub(r"\s+", " ", str(exc)) or type(exc).__name__
        error = error if len(error) <= 200 else f"{error[:200]}..."
        return Refusal(f"messages[{j}]: the {self.renderer.name} renderer failed to render {upto}: {error}")

    def _decode(self, ids: list[int]) -> str:
        return self.renderer.decode(ids)


def sft_renderer(model: ModelConfig, tokenizer: Any, choice: RendererChoice | None = None) -> RowRenderer:
    """What SFT trains `model` through: the family's renderer where `[model] renderer` gives one (as RL and
    sampling render), else the chat template's target rule. `choice`: the renderer a run recorded (a resume
    and `compare` keep it, `tokenization.run_renderer_choice`); default: what `[model]` resolves to now."""
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.renderer import CHAT_TEMPLATE
    from loops_nb.sft.rendering import Renderer
    from loops_nb.tokenization import check_chat_template, model_renderer_choice, text_renderer

    choice = choice or model_renderer_choice(model)
    if choice.name == CHAT_TEMPLATE:
        check_chat_template(model, tokenizer, choice)
        return Renderer(tokenizer, max_seq_len=model.max_seq_len)
    family = text_renderer(model, tokenizer, choice)
    assert isinstance(family, PrimeRenderer)  # any choice but the chat template is a family's renderer
    return FamilyTargets(family, max_seq_len=model.max_seq_len)
