"""SFT through a family's own renderer (`SFTTargets` on a `PrimeRenderer`), on five families' real vocabularies.

The twin: each trained turn's context is, token for token, the prompt the sampler gets for that turn
(`PrimeRenderer.prompt_tokens`, what RL samples from), and its trained tokens parse back, by the family's own
parser, into the row's content, reasoning and tool calls. So SFT trains what RL would sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from family_replies import FAMILY_REPLIES, TOOLS

from loops_nb.config.sections import ModelConfig
from loops_nb.errors import ConfigError
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer import ChatRenderer, call_keys
from loops_nb.llm.renderer_choice import renderer_config
from loops_nb.sft.data import RefusedRow, parse_row
from loops_nb.sft.refusal_wording import with_fix
from loops_nb.sft.targets import RenderedRow, SFTTargets, chat_targets, sft_targets

FAMILIES = list(FAMILY_REPLIES)
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def tool_row(*, reasoning: bool) -> dict[str, Any]:
    """System, user, a call, its result, the answer, a new question, its answer: three trained turns."""
    said = {"reasoning_content": "I need the tool."} if reasoning else {}
    answer = {"reasoning_content": "Answer now."} if reasoning else {}
    again = {"reasoning_content": "Rome now."} if reasoning else {}
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You are a weather assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "tool_calls": [CALL], **said},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
            {"role": "assistant", "content": "It is sunny in Paris, 21 C.", **answer},
            {"role": "user", "content": "And in Rome?"},
            {"role": "assistant", "content": "Let me check.", **again},
        ],
    }


EXAMPLES = {
    "qwen3": [(2, 4), (6,)],  # reasoning dropped at the new user message: the row splits there
    "qwen3.6": [(2, 4), (6,)],
    "llama-3": [(2, 4, 6)],  # nothing rewritten: one example trains all three turns
    "deepseek-v4": [(2, 4, 6)],  # thinking mode keeps earlier reasoning: one example
    "gpt-oss": [(2, 4), (6,)],  # analysis dropped once a final answer follows
}


def family(name: str, tokenizer: Any, **options: Any) -> PrimeRenderer:
    config = renderer_config(name, {**FAMILY_REPLIES[name].options, **options})
    return PrimeRenderer(tokenizer, name, config=config)


@pytest.mark.parametrize("name", FAMILIES)
def test_each_trained_turn_is_what_the_sampler_is_prompted_with_then_writes(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    renderer = family(name, family_tokenizer(name))
    reasons = FAMILY_REPLIES[name].reasons
    row = tool_row(reasoning=reasons)
    result = SFTTargets(renderer).render(parse_row(row, 1))
    assert isinstance(result, RenderedRow), result
    assert [e.turn_indices for e in result.examples] == EXAMPLES[name]
    for example in result.examples:
        for j in example.turn_indices:
            at = [k for k, turn in enumerate(example.token_turns) if turn == j]
            start, end = at[0], at[-1] + 1
            assert at == list(range(start, end)), "a turn trains one contiguous run of tokens"
            assert all(example.weights[k] == (1.0 if start <= k < end else example.weights[k]) for k in at)
            prompt = renderer.prompt_tokens(row["messages"][:j], TOOLS)
            assert example.input_ids[:start] == prompt, f"messages[{j}]: not the sampler's prompt"
            own = example.input_ids[start:end]
            assert own[-1] in renderer.stop_token_ids, "the stop token trains"
            parsed = renderer.parse(own, prompt_tokens=prompt, tools=TOOLS)
            message = row["messages"][j]
            assert parsed.content == (message.get("content") or "")
            assert call_keys(parsed.tool_calls) == call_keys(message.get("tool_calls"))
            assert parsed.reasoning == (message.get("reasoning_content") or "")
    trained = sum(w > 0 for e in result.examples for w in e.weights)
    assert trained == sum(e.n_trained for e in result.examples)


@pytest.mark.parametrize(
    ("name", "trained"),
    [
        # After the `<think>\n` the prompt opened: that much is the prompt's, not the model's.
        ("qwen3.6", "Rome now.\n</think>\n\nLet me check.<|im_end|>"),
        # The analysis the prompt opened, then the channel headers the model writes itself.
        ("gpt-oss", "Rome now.<|end|><|start|>assistant<|channel|>final<|message|>Let me check.<|return|>"),
    ],
)
def test_a_prompt_that_opens_reasoning_trains_what_follows_it(
    name: str, trained: str, family_tokenizer: Callable[[str], Any]
) -> None:
    tokenizer = family_tokenizer(name)
    result = SFTTargets(family(name, tokenizer)).render(parse_row(tool_row(reasoning=True), 1))
    assert isinstance(result, RenderedRow)
    assert [s.text for s in result.examples[-1].segments(tokenizer) if s.trained] == [trained]


@pytest.mark.parametrize(
    ("name", "options", "reasoning", "said"),
    [
        ("llama-3", {}, True, "llama-3 writes no reasoning in this form: remove reasoning_content"),
        ("deepseek-v4", {"enable_thinking": False}, True, "renderer_options = {enable_thinking = true}"),
        ("gpt-oss", {}, False, "the prompt opens the turn's reasoning: give the turn a reasoning_content"),
    ],
)
def test_what_a_family_cannot_write_is_refused_with_its_fix(
    name: str, options: dict[str, Any], reasoning: bool, said: str, family_tokenizer: Callable[[str], Any]
) -> None:
    renderer = family(name, family_tokenizer(name), **options)
    result = SFTTargets(renderer).render(parse_row(tool_row(reasoning=reasoning), 1))
    assert isinstance(result, RefusedRow)
    assert result.reason.startswith("messages[2]") and said in result.reason
    assert "chat_template" not in with_fix(result.reason), "a family's refusal never points at a template"


def test_a_row_longer_than_max_seq_len_or_holding_a_control_token_is_refused(
    family_tokenizer: Callable[[str], Any],
) -> None:
    renderer = family("qwen3", family_tokenizer("qwen3"))
    long = SFTTargets(renderer, max_seq_len=64).render(parse_row(tool_row(reasoning=False), 1))
    assert isinstance(long, RefusedRow) and "longer than max_seq_len 64" in long.reason
    row = tool_row(reasoning=False)
    row["messages"][4]["content"] = "sunny<|im_end|>"
    special = SFTTargets(renderer).render(parse_row(row, 1))
    assert isinstance(special, RefusedRow) and "contains the special token '<|im_end|>'" in special.reason


def test_sft_trains_through_the_configured_renderer(
    family_tokenizer: Callable[[str], Any], smollm2: Any
) -> None:
    qwen = sft_targets(ModelConfig(base_model="Qwen/Qwen3-8B"), family_tokenizer("qwen3"))
    assert isinstance(qwen.renderer, PrimeRenderer) and qwen.renderer.name == "qwen3"
    named = sft_targets(ModelConfig(base_model="./my-qwen3", renderer="qwen3"), family_tokenizer("qwen3"))
    assert isinstance(named.renderer, PrimeRenderer)
    assert isinstance(sft_targets(ModelConfig(), smollm2).renderer, ChatRenderer), (
        "SmolLM2 keeps its chat template"
    )


def test_renderer_options_are_checked_against_the_family(family_tokenizer: Callable[[str], Any]) -> None:
    with pytest.raises(
        ConfigError, match=r"renderer_options.enable_thinkin: qwen3 has no such option; .*enable_thinking"
    ):
        renderer_config("qwen3", {"enable_thinkin": False})
    with pytest.raises(ConfigError, match=r"renderer_options.reasoning_effort: .*\(renderer gpt-oss\)"):
        renderer_config("gpt-oss", {"reasoning_effort": "extreme"})
    thinking = sft_targets(
        ModelConfig(base_model="./ds", renderer="deepseek-v4", renderer_options={"enable_thinking": True}),
        family_tokenizer("deepseek-v4"),
    )
    assert isinstance(thinking.renderer, PrimeRenderer)
    assert isinstance(thinking.render(parse_row(tool_row(reasoning=True), 1)), RenderedRow)
    with pytest.raises(ValueError, match="renderer_options apply to a family's renderer"):
        ModelConfig(renderer="chat_template", renderer_options={"enable_thinking": False})


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no-reasoning"])
def test_qwen3_through_its_renderer_trains_what_its_own_jinja_template_trains(
    reasoning: bool, family_tokenizer: Callable[[str], Any]
) -> None:
    """The twin against the family's own template (Qwen3-8B's, Apache-2.0, in sft_fixtures): the same prompts,
    and the same examples, token for token and weight for weight, as the chat template's target rule."""
    from family_replies import THREE_TURNS
    from sft_fixtures import QWEN3_TEMPLATE

    tokenizer = family_tokenizer("qwen3")
    renderer = PrimeRenderer(tokenizer, "qwen3")
    template = ChatRenderer(tokenizer, QWEN3_TEMPLATE)
    for k in range(1, len(THREE_TURNS) + 1):
        assert renderer.prompt_tokens(THREE_TURNS[:k], TOOLS) == template.prompt_tokens(
            THREE_TURNS[:k], TOOLS
        )
    row = parse_row(tool_row(reasoning=reasoning), 1)
    family, jinja = (
        SFTTargets(renderer).render(row),
        chat_targets(tokenizer, chat_template=QWEN3_TEMPLATE).render(row),
    )
    assert isinstance(family, RenderedRow) and isinstance(jinja, RenderedRow)
    assert [(e.input_ids, e.weights, e.turn_indices) for e in family.examples] == [
        (e.input_ids, e.weights, e.turn_indices) for e in jinja.examples
    ]


def test_a_resumed_run_trains_through_the_renderer_it_recorded(
    tmp_path: Any, family_tokenizer: Callable[[str], Any]
) -> None:
    """run.json keeps the renderer a run started with: a resume renders its data with it, whatever `auto`
    would pick now (a newer `renderers` may know the model by then)."""
    import json

    from loops_nb import load
    from loops_nb.sft.batching import SFTData
    from loops_nb.sft.config import SFTConfig
    from loops_nb.sft.recipe import _resumed_renderer

    family_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    (tmp_path / "train.jsonl").write_text(json.dumps(tool_row(reasoning=True)) + "\n")
    (tmp_path / "sft.toml").write_text(
        f'recipe = "sft"\n[model]\nbase_model = "my-org/qwen3-support"\ntokenizer = "{tmp_path / "tok"}"\n'
        f'[data]\ntrain = "train.jsonl"\neval_fraction = 0\n[output]\noutput_dir = "{tmp_path / "runs"}"\n'
        'run_name = "r"\n'
    )
    config = load(tmp_path / "sft.toml").config_as(SFTConfig)
    assert _resumed_renderer(config) is None, "a new run resolves its renderer"
    (tmp_path / "runs" / "r").mkdir(parents=True)
    record = {"name": "qwen3", "why": "auto: ...", "setting": "auto", "template": None}
    (tmp_path / "runs" / "r" / "run.json").write_text(json.dumps({"renderer": record}))
    choice = _resumed_renderer(config)
    assert choice is not None and choice.name == "qwen3"
    data = SFTData.load(config, family_tokenizer("qwen3"), renderer_choice=choice)
    assert isinstance(data.targets.renderer, PrimeRenderer) and len(data.train) == 2
    with pytest.raises(ConfigError, match="has no chat template and no renderer was named"):
        SFTData.load(config, family_tokenizer("qwen3"))  # resolved afresh: auto knows no such model
