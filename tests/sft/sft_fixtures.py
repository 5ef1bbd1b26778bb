"""Offline tokenizers with real chat templates, for the SFT tests (imported by conftest.py and the tests).

Each tokenizer is a byte-level BPE trained in-process on a small corpus (milliseconds), with the special tokens
and the pre-tokenizer regex of the model family it stands in for, wrapped in `PreTrainedTokenizerFast` with that
family's chat template. Byte-level BPE round-trips any text, so the exact-text assertions hold even for words the
corpus never saw; the regexes matter because they decide how text next to a turn boundary splits into tokens.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE

# Verbatim from the SmolLM2-Instruct GGUF metadata (tokenizer.chat_template).
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen3's template (Qwen/Qwen3-8B tokenizer_config.json), unchanged but for whitespace: reasoning is kept only for
# assistant turns after the last user query, and the last turn always carries a <think> block.
QWEN3_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# Meta-Llama-3-8B-Instruct's template, verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Pre-tokenizer regexes of the real tokenizers (GPT-2's is ByteLevel's built-in one, used by SmolLM2).
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

_CORPUS = [
    "What is the capital of France? The capital of France is Paris.",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "Hello! How can I help you today? I am fine, thank you. Let me think about it.",
    "What's the weather in Paris? It is sunny and 22 degrees. Call the get_weather tool.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}',
    "user assistant system tool think tool_call tool_response tools function arguments",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > | : ; , . ! ?",
    "First paragraph.\n\nSecond paragraph.\n\nThird one.\n",
    "A header\n\n",
    "Another header\n\n",
]

FAMILIES: dict[str, dict[str, Any]] = {
    "smollm2": {
        "template": SMOLLM2_CHAT_TEMPLATE,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "added": [],
        "bos": "<|im_start|>",
        "eos": "<|im_end|>",
        "regex": None,
    },
    "smollm2_tools": {
        "template": TOOL_CAPABLE_CHATML_TEMPLATE,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "added": [],
        "bos": "<|im_start|>",
        "eos": "<|im_end|>",
        "regex": None,
    },
    "qwen3": {
        "template": QWEN3_TEMPLATE,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "added": [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
        ],
        "bos": None,
        "eos": "<|im_end|>",
        "regex": QWEN2_REGEX,
    },
    "llama3": {
        "template": LLAMA3_TEMPLATE,
        "special": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "added": [],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "regex": LLAMA3_REGEX,
    },
}


@cache
def _core(regex: str | None, special: tuple[str, ...], added: tuple[str, ...]) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    if regex is None:
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        core.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 3, trainer)
    core.add_tokens(list(added))
    return core.to_str()


def build_tokenizer(family: str, *, template: str | None = None, regex: str | bool | None = False) -> Any:
    """A fresh `PreTrainedTokenizerFast` for a model family ("smollm2", "smollm2_tools", "qwen3", "llama3").

    ``template`` replaces the family's chat template; ``regex`` (a pattern, or None for GPT-2's) replaces its
    pre-tokenizer, to pair a template with a tokenizer it was not made for.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    core = Tokenizer.from_str(
        _core(spec["regex"] if regex is False else regex, tuple(spec["special"]), tuple(spec["added"]))
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["special"][0],
        additional_special_tokens=spec["special"],
        chat_template=template or spec["template"],
    )


def write_jsonl(path: Any, rows: list[Any]) -> Any:
    """Write rows (dicts, or raw strings written as-is) one per line."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path
