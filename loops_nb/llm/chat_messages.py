"""The chat data a renderer takes and gives back, named: OpenAI-shaped JSON objects, as agents, the gateway and
SFT rows write them (a renderer reads the keys its format has and leaves the rest)."""

from typing import Any

ChatMessage = dict[str, Any]
"""One message: `role`, `content` (a string, or a list of parts with images), and where they apply
`tool_calls`, `tool_call_id`, `name`, `reasoning_content`."""
ToolSpec = dict[str, Any]
"""One tool a request offers: `{"type": "function", "function": {"name", "description", "parameters"}}`."""
ToolCall = dict[str, Any]
"""One call: `{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a JSON string (an
object once `renderers` has decoded it)."""
