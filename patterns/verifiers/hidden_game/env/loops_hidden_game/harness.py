"""An in-process chat harness: no program to install, so the environment runs offline.

verifiers 0.4's built-in `null` harness launches a PEP 723 chat program (`uv sync --script`, which needs
PyPI the first time). The Harness contract allows the loop to run in-process instead, as long as every
model call goes through the rollout's interception `endpoint` with its bearer `secret`; the trace is the
record of what ran. This loop sends Chat Completions (with `tools` when the task offers any), runs the
task's tool calls here, and stops after a reply without tool calls or after `max_turns` model calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire


def lookup_game(answer: str, **_: object) -> str:
    return f"Today's hidden board game is {answer.capitalize()}."


# Tools a task may name in `HiddenGameData.tools`: the Chat Completions spec and the function run here.
TOOLS: dict[str, tuple[dict, Callable[..., str]]] = {
    "lookup_game": (
        {
            "type": "function",
            "function": {
                "name": "lookup_game",
                "description": "Look up which board game is hidden today.",
                "parameters": {"type": "object", "properties": {}, "required": []},
            },
        },
        lookup_game,
    ),
}


# Built once: an httpx client builds a TLS context (CA bundle read, ~20 ms of CPU) unless given one, and
# this harness opens a client per episode.
TLS = httpx.create_ssl_context()


class ChatHarnessConfig(vf.HarnessConfig):
    max_turns: int = 3
    """Model calls per episode at most (a tool result needs a second call to be answered)."""
    request_timeout: float = 600.0


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = []
        if system:
            messages.append({"role": "system", "content": system})
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(message) for message in prompt)
        names = list(getattr(data, "tools", None) or [])
        tools = [TOOLS[name][0] for name in names]
        url = endpoint.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.request_timeout, connect=10.0), verify=TLS
        ) as client:
            for _ in range(self.config.max_turns):
                body: dict = {"model": ctx.model, "messages": messages}
                if tools:
                    body["tools"] = tools
                response = await client.post(url, json=body, headers=headers)
                if response.status_code != 200:
                    return vf.ProgramResult(
                        1, "", f"chat/completions {response.status_code}: {response.text[:2000]}"
                    )
                message = response.json()["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                reply = {"role": "assistant", "content": message.get("content") or ""}
                if calls:
                    reply["tool_calls"] = calls
                messages.append(reply)
                if not calls:
                    break
                for call in calls:
                    messages.append(
                        {"role": "tool", "tool_call_id": call.get("id", ""), "content": _run_tool(call, data)}
                    )
        return vf.ProgramResult(0, "", "")


def _run_tool(call: dict, data: vf.TaskData) -> str:
    function = call.get("function") or {}
    name = function.get("name", "")
    if name not in TOOLS or name not in (getattr(data, "tools", None) or []):
        return f"error: no tool named {name!r}"
    try:
        args = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as e:
        return f"error: the arguments are not JSON ({e})"
    if not isinstance(args, dict):
        args = {}
    args.pop("answer", None)
    return TOOLS[name][1](answer=getattr(data, "answer", ""), **args)
