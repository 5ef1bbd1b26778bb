"""Chat templates: rendering them exactly as transformers does (`ChatTemplate`), the built-in ones
(`chatml-tools`, `gemma`), and `parse_assistant_text`, which reads back a reply in their Hermes/Qwen syntax
where `renderers` has no family renderer to parse it (docs/reference/renderers.md).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loops_nb.errors import ConfigError
from loops_nb.llm.chat_messages import ChatMessage, ParsedReply, ToolCall, ToolSpec, tool_call

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The Hermes tool syntax (what `parse_assistant_text` reads back) that chatml-tools and gemma share, spliced into
# both as text, not called as a Jinja macro, so that each template's source stays byte for byte what it was: a
# Gemma converted from GGUF saved the template's text in its tokenizer, and an older conversion's must still be
# GEMMA_CHAT_TEMPLATE exactly. The tool list after its heading; it reads `tools`.
_HERMES_TOOL_LIST = """\
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' }}
"""
# An assistant turn's calls after its text; it reads `message`, and `content` (the turn's text as rendered).
_HERMES_TOOL_CALLS = """\
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": ' + (fn.name | tojson) + ', "arguments": ' }}
            {%- if fn.arguments is string %}
                {{- fn.arguments }}
            {%- else %}
                {{- fn.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
"""

TOOL_CAPABLE_CHATML_TEMPLATE = (
    """\
{%- if messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
"""
    + _HERMES_TOOL_LIST
    + """\
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in rest %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + content }}
"""
    + _HERMES_TOOL_CALLS
    + """\
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>tool\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
)

# Gemma 3's turn format (``<bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n``) for a Gemma
# whose tokenizer has no template (the base model's GGUF, model_store). Like Google's, it folds the system prompt
# into the first user turn and names the assistant ``model``; unlike it, content is not trimmed (a reply that
# ends in a newline would render differently once history, and break multi-turn extension and SFT targets),
# and tools are listed and called in the Hermes style of chatml-tools, which `parse_assistant_text` reads
# (Gemma 3 has no tool tokens of its own); a tool result is a user turn.
GEMMA_CHAT_TEMPLATE = (
    """\
{%- macro text(message) %}
    {%- if message.content is string %}
        {{- message.content }}
    {%- elif message.content %}
        {%- for part in message.content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- macro tool_list() %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
"""
    + _HERMES_TOOL_LIST
    + """\
{%- endmacro %}
{{- bos_token }}
{%- if messages and messages[0].role == 'system' %}
    {%- set system = text(messages[0]) %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = '' %}
    {%- set rest = messages %}
{%- endif %}
{%- set preamble = system + ('\\n\\n' if system and tools else '') + (tool_list() if tools else '') %}
{%- set fold = preamble and rest and rest[0].role == 'user' %}
{%- if preamble and not fold %}
    {{- '<start_of_turn>user\\n' + preamble + '<end_of_turn>\\n' }}
{%- endif %}
{%- for message in rest %}
    {%- set prefix = preamble + '\\n\\n' if fold and loop.first else '' %}
    {%- if message.role == 'assistant' %}
        {%- set content = text(message) %}
        {{- '<start_of_turn>model\\n' + content }}
"""
    + _HERMES_TOOL_CALLS
    + """\
        {{- '<end_of_turn>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<start_of_turn>user\\n' + prefix + '<tool_response>\\n' + text(message) + '\\n</tool_response><end_of_turn>\\n' }}
    {%- else %}
        {{- '<start_of_turn>' + message.role + '\\n' + prefix + text(message) + '<end_of_turn>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\\n' }}
{%- endif %}
"""
)

# Templates a config can name instead of giving a file ([model] chat_template).
BUILTIN_TEMPLATES = {"chatml-tools": TOOL_CAPABLE_CHATML_TEMPLATE, "gemma": GEMMA_CHAT_TEMPLATE}

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
# Qwen3.5/3.6 (and Qwen3-Coder): <function=name> then <parameter=key>\nvalue\n</parameter> for each argument.
_XML_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_XML_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def parse_assistant_text(
    text: str, *, tools: Sequence[Mapping[str, Any]] | None = None, reasoning_open: bool = False
) -> ParsedReply:
    """Split text generated under `TOOL_CAPABLE_CHATML_TEMPLATE` (or a Qwen/Hermes template) into reasoning,
    content and calls (docs/reference/renderers.md has the rules). ``reasoning_open``: the prompt opened a
    ``<think>`` block; ``tools`` type XML arguments. A malformed or cut-off block is reported in ``tool_call_errors``,
    never raised: a model under training writes such blocks, and evaluation has to score them, not crash.
    """
    reasoning, rest = split_generated_reasoning(text, reasoning_open=reasoning_open)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, match in enumerate(_TOOL_CALL_RE.finditer(rest)):
        if not match.group(0).endswith("</tool_call>"):
            errors.append(f"tool call {i}: no closing </tool_call>")
            continue
        body = match.group(1).strip()
        call = _xml_call(body, tools) if body.startswith("<function=") else _json_call(body)
        if isinstance(call, str):
            errors.append(f"tool call {i}: {call}")
        else:
            calls.append(tool_call(f"call_{len(calls)}", call["name"], call["arguments"]))
    content = _TOOL_CALL_RE.sub("", rest).strip()
    return ParsedReply(text, content, calls, errors, reasoning)


def split_generated_reasoning(text: str, *, reasoning_open: bool = False) -> tuple[str, str]:
    """``(reasoning, the rest)`` of generated text: see `parse_assistant_text`."""
    start, end = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if end != -1 and (start == -1 or start < end):
        begin = start + len(THINK_OPEN) if start != -1 else 0
        before = text[:start] if start != -1 else ""
        return text[begin:end].strip(), before + text[end + len(THINK_CLOSE) :]
    if start != -1:  # opened and never closed: the reply was cut off while reasoning
        return text[start + len(THINK_OPEN) :].strip(), text[:start]
    if reasoning_open:
        return text.strip(), ""
    return "", text


def _json_call(body: str) -> dict[str, Any] | str:
    """``{"name", "arguments"}`` of a JSON call, or what is wrong with it."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return 'expected {"name": <string>, "arguments": <object>}'
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models double-encode, as OpenAI's wire format does
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args)
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    return {"name": call["name"], "arguments": args}


def _xml_call(body: str, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | str:
    """``{"name", "arguments"}`` of an XML call, or what is wrong with it."""
    match = _XML_FUNCTION_RE.fullmatch(body)
    if match is None:
        return "expected <function=name> ... </function>"
    name, inner = match.group(1).strip(), match.group(2)
    strings = _string_parameters(tools, name)
    args: dict[str, Any] = {}
    for param in _XML_PARAMETER_RE.finditer(inner):
        # The template writes each value between two newlines; only those are markup.
        key = param.group(1).strip()
        args[key] = param.group(2).removeprefix("\n").removesuffix("\n")
        if key not in strings:
            with contextlib.suppress(json.JSONDecodeError):
                args[key] = json.loads(args[key])
    if _XML_PARAMETER_RE.sub("", inner).strip():
        return f"text outside <parameter=...> blocks in <function={name}>"
    return {"name": name, "arguments": args}


def _string_parameters(tools: Sequence[Mapping[str, Any]] | None, name: str) -> set[str]:
    """The parameters of tool `name` that its schema declares strings (their XML values are taken verbatim)."""
    for tool in tools or []:
        spec = tool.get("function", tool)
        if isinstance(spec, Mapping) and spec.get("name") == name:
            props = (spec.get("parameters") or {}).get("properties") or {}
            return {k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "string"}
    return set()


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The well-formed ``<tool_call>`` blocks in ``text``, as ``{"name": str, "arguments": dict}`` in order."""
    calls = parse_assistant_text(text).tool_calls
    return [
        {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in calls
    ]


class ChatTemplate:
    """A tokenizer's chat template (or an override), rendered to text the way ``apply_chat_template`` does,
    without its per-call copying of the inputs: rendering is the hot loop of `check` and data loading
    (docs/reference/renderers.md, "Rendering exactly as transformers does")."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: str | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._override = template
        # HF passes the named special tokens (bos_token, eos_token, ...) to every template; ``variables`` (e.g.
        # enable_thinking) override them, as apply_chat_template's kwargs do.
        self._variables = {**(getattr(tokenizer, "special_tokens_map", None) or {}), **(variables or {})}
        self._compiled: dict[bool, Any] = {}
        self.source_with_tools = self._source(tools=True)
        self.source = self._source(tools=False)

    def _source(self, tools: bool) -> str:
        try:
            return self._tokenizer.get_chat_template(self._override, [{}] if tools else None)
        except ValueError as exc:
            raise ConfigError(f"no usable chat template: {exc}") from None

    def _compiled_for(self, tools: bool) -> Any:
        compiled = self._compiled.get(tools)
        if compiled is None:
            try:
                from transformers.utils.chat_template_utils import _compile_jinja_template
            except ImportError:  # a private helper: fall back to the public (slower) path if it moves
                compiled = False
            else:
                compiled = _compile_jinja_template(self.source_with_tools if tools else self.source)
            self._compiled[tools] = compiled
        return compiled

    def render(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """Render messages to text. Template errors (``raise_exception``, bad data) propagate as Jinja errors."""
        compiled = self._compiled_for(bool(tools))
        if compiled is False:
            # apply_chat_template's tools are a list of schemas or functions; a list of schemas is one.
            schemas: list[dict[str, Any] | Callable[..., Any]] | None = None if tools is None else list(tools)
            text = self._tokenizer.apply_chat_template(
                messages,
                tools=schemas,
                chat_template=self.source_with_tools if tools else self.source,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self._variables,
            )
            assert isinstance(text, str)  # tokenize=False renders one conversation to one string
            return text
        return compiled.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._variables,
        )
