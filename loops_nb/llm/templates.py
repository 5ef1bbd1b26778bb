"""Chat templates: rendering them fast and exactly as transformers does, and a tool-capable ChatML template.

SmolLM2's own template (the offline default model) has no notion of tools: it ignores ``tools`` and renders an
assistant turn that only holds ``tool_calls`` as an empty turn. `TOOL_CAPABLE_CHATML_TEMPLATE` is a drop-in
replacement for SmolLM2's tokenizer (same ``<|im_start|>``/``<|im_end|>`` tokens, same default system prompt)
in the Hermes/Qwen style that small open models know: tools listed as JSON in a ``<tools>`` block of the system
prompt, calls written as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, results in a ``tool`` turn
wrapped in ``<tool_response>``. `parse_tool_calls` reads that call format back from generated text.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loops_nb.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Verbatim from the SmolLM2-Instruct GGUF metadata (tokenizer.chat_template).
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOL_CAPABLE_CHATML_TEMPLATE = """\
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
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in rest %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + content }}
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

# Templates a config can name instead of giving a file ([model] chat_template).
BUILTIN_TEMPLATES = {"chatml-tools": TOOL_CAPABLE_CHATML_TEMPLATE}

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class AssistantReply:
    """Generated assistant text split into its prose and its ``<tool_call>`` blocks."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        """The calls in OpenAI shape (``arguments`` as a JSON string, ids ``call_0``, ``call_1``, ...)."""
        return [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for i, c in enumerate(self.tool_calls)
        ]


def parse_assistant_text(text: str) -> AssistantReply:
    """Split text generated under `TOOL_CAPABLE_CHATML_TEMPLATE` (or Qwen/Hermes templates) into content and calls.

    A block that is not ``{"name": <string>, "arguments": <object>}`` JSON, or is cut off before
    ``</tool_call>``, is reported in ``errors`` rather than raised: a model under training writes such blocks,
    and evaluation has to score them, not crash.
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    for i, match in enumerate(_TOOL_CALL_RE.finditer(text)):
        if not match.group(0).endswith("</tool_call>"):
            errors.append(f"tool call {i}: no closing </tool_call>")
            continue
        try:
            call = json.loads(match.group(1).strip())
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {i}: not valid JSON ({exc.msg})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            errors.append(f'tool call {i}: expected {{"name": <string>, "arguments": <object>}}')
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):  # some models double-encode, as OpenAI's wire format does
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        if not isinstance(args, dict):
            errors.append(f"tool call {i}: arguments must be a JSON object")
            continue
        calls.append({"name": call["name"], "arguments": args})
    content = _TOOL_CALL_RE.sub("", text).strip()
    return AssistantReply(content=content, tool_calls=calls, errors=errors)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The well-formed ``<tool_call>`` blocks in ``text``, as ``{"name": str, "arguments": dict}`` in order."""
    return parse_assistant_text(text).tool_calls


class ChatTemplate:
    """A tokenizer's chat template (or an override), rendered to text the way ``apply_chat_template`` does.

    It compiles through transformers' own (cached) sandboxed Jinja environment, so filters like ``tojson`` and
    globals like ``raise_exception`` behave identically, but skips ``apply_chat_template``'s per-call copying of
    its inputs: rendering is the hot loop of `check` and data loading.
    """

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
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
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
