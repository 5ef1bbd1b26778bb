"""`ShellAgent`: a reusable multi-turn terminal agent with two tools, `shell` and `write_file`.

Each turn's tool calls run in the trial's sandbox (`environment.exec`, any Harbor backend); it stops when the
model answers without a call, or after `max_turns` calls. Every turn is appended to `self.transcript` as it
happens, so an attempt cut off by its timeout still shows what it did. What the model gets wrong (an unknown
tool, bad arguments, an unparsable `<tool_call>`, a timeout, a non-zero exit) is answered as text it reads
next turn, never raised: that is how a policy under training learns to stop doing it. A sandbox that fails
otherwise raises, and the attempt is discarded. docs/reference/harbor.md has its options.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harbor.agents.options import AgentOptions
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.agent.context import AgentContext
from pydantic import Field

from loops_nb.harbor.agent import LoopsAgent
from loops_nb.llm.chat_messages import ToolCall, ToolSpec

if TYPE_CHECKING:
    from loops_nb.llm.client import Reply

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent solving a task in a Linux sandbox through tools.\n"
    "- shell: run one bash command in the task's working directory. Each command runs in a fresh shell: "
    "files persist between commands, but `cd`, exported variables and background processes do not "
    "(chain with && when you need them).\n"
    "- write_file: create or overwrite a file with exactly the given content.\n"
    "Look before you act, then check your work with shell. When the task is done, reply with a short "
    "summary and no tool call."
)

TOOLS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": (
                "Run a bash command in the sandbox's working directory; returns its exit code, stdout and "
                "stderr (long output is shortened in the middle)."
            ),
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "e.g. ls -la"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file with exactly this content (parent directories are made).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "absolute, or relative to the working directory",
                    },
                    "content": {"type": "string", "description": "the whole new content of the file"},
                },
                "required": ["path", "content"],
            },
        },
    },
]

TIMEOUT_GRACE_SECONDS = 30.0
"""How long past `command_timeout` to wait for a backend that ignores its own timeout."""
WRITE_CHUNK_CHARS = 32_000
"""`write_file` sends content in pieces of this size: one shell argument must stay under Linux's 128 KiB."""


@dataclass
class ShellStats:
    """What one attempt did; lands in Harbor's result (`agent_result.metadata["shell_agent"]`)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    commands: int = 0
    nonzero_exits: int = 0
    timeouts: int = 0
    files_written: int = 0
    stop: str = "running"
    """`answered` (a reply without a tool call), `max_turns`, or `running` while it runs."""


class ShellAgentOptions(AgentOptions):
    """`[runtime.options] agent_kwargs` of a ShellAgent; an unknown key fails when Harbor builds the agent.

    A subclass with options of its own extends this model and names it in `options_model`.
    """

    max_turns: int = Field(default=20, ge=1, description="Model calls per attempt.")
    command_timeout: float = Field(default=60.0, gt=0, description="Seconds per shell command.")
    max_output_chars: int = Field(
        default=4000, ge=200, description="Characters of stdout + stderr shown to the model per command."
    )
    system_prompt: str | None = Field(
        default=None, description='Replaces DEFAULT_SYSTEM_PROMPT; "" sends no system message.'
    )


class ShellAgent(LoopsAgent):
    """A terminal agent: `shell` and `write_file` tools, up to `max_turns` model calls (`ShellAgentOptions`)."""

    options_model: ClassVar[type[AgentOptions] | None] = ShellAgentOptions

    def __init__(self, logs_dir: Path, **kwargs: Any) -> None:
        super().__init__(logs_dir, **kwargs)  # Harbor validates the options against `options_model`
        options = self.options if isinstance(self.options, ShellAgentOptions) else ShellAgentOptions()
        self.max_turns = options.max_turns
        self.command_timeout = options.command_timeout
        self.max_output_chars = options.max_output_chars
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if options.system_prompt is None else options.system_prompt
        self.tools = TOOLS
        self.stats = ShellStats()

    @staticmethod
    def name() -> str:
        return "loops-shell-agent"

    # -- the loop -------------------------------------------------------------------------------
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        messages = self.transcript  # appended in place: a timeout leaves every finished turn behind
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": instruction.strip()})
        # `context` is left alone: Harbor fills an empty one afterwards (populate_context_post_run).
        for _ in range(self.max_turns):
            reply = await self.llm.chat(messages, tools=self.tools)
            self.stats.turns += 1
            if reply.tool_call_errors and not reply.tool_calls:
                # Keep the text as sampled, unreadable block included: the next prompt then extends the
                # exact sampled tokens (reply.message drops the block, which would start a new sequence).
                messages.append({"role": "assistant", "content": reply.text})
            else:
                messages.append(reply.message)
            if not reply.tool_calls and not reply.tool_call_errors:
                self.stats.stop = "answered"
                return
            for call in reply.tool_calls:
                result = await self.call_tool(call, environment)
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
            if reply.tool_call_errors:
                # Unparsed blocks have no call id to answer: say what was wrong in a user turn.
                self.stats.tool_errors += len(reply.tool_call_errors)
                messages.append({"role": "user", "content": unparsed_calls_message(reply)})
        self.stats.stop = "max_turns"

    def populate_context_post_run(self, context: AgentContext) -> None:
        super().populate_context_post_run(context)
        context.metadata = {**(context.metadata or {}), "shell_agent": asdict(self.stats)}

    async def call_tool(self, call: ToolCall, environment: BaseEnvironment) -> str:
        """Run one OpenAI-shaped tool call; the text the model reads back (errors included)."""
        self.stats.tool_calls += 1
        function = call.get("function") or {}
        name = function.get("name")
        try:
            args = _arguments(function.get("arguments"))
            if name == "shell":
                return await self.shell(environment, _string(args, "command"))
            if name == "write_file":
                return await self.write(environment, _string(args, "path"), _string(args, "content"))
            raise ValueError(f"unknown tool {name!r}; the tools are shell and write_file")
        except ValueError as exc:
            self.stats.tool_errors += 1
            return f"error: {exc}"

    # -- the tools ------------------------------------------------------------------------------
    async def shell(self, environment: BaseEnvironment, command: str) -> str:
        if not command.strip():
            raise ValueError("command is empty")
        self.stats.commands += 1
        result = await self._exec(environment, command)
        if result is None:
            return f"error: the command timed out after {self.command_timeout:g} seconds and was stopped"
        if result.return_code != 0:
            self.stats.nonzero_exits += 1
        return format_result(
            result.return_code, result.stdout or "", result.stderr or "", self.max_output_chars
        )

    async def write(self, environment: BaseEnvironment, path: str, content: str) -> str:
        if not path.strip():
            raise ValueError("path is empty")
        if "\x00" in content or "\x00" in path:
            raise ValueError("the path and content cannot contain NUL characters")
        target = shlex.quote(path)
        # printf %s of a quoted argument writes the bytes exactly (no heredoc terminator, no escapes);
        # long content goes in pieces so no single argument exceeds the kernel's limit.
        pieces = [
            content[i : i + WRITE_CHUNK_CHARS] for i in range(0, max(len(content), 1), WRITE_CHUNK_CHARS)
        ]
        for i, piece in enumerate(pieces):
            command = f"printf %s {shlex.quote(piece)} {'>' if i == 0 else '>>'} {target}"
            if i == 0:
                command = f'mkdir -p -- "$(dirname -- {target})" && {command}'
            result = await self._exec(environment, command)
            if result is None:
                return f"error: writing {path} timed out after {self.command_timeout:g} seconds"
            if result.return_code != 0:
                self.stats.tool_errors += 1
                detail = (result.stderr or result.stdout or "").strip()
                return (
                    f"error: could not write {path}: {clip(detail, 500) or f'exit code {result.return_code}'}"
                )
        self.stats.files_written += 1
        return f"wrote {len(content.encode())} bytes to {path}"

    async def _exec(self, environment: BaseEnvironment, command: str) -> ExecResult | None:
        """`environment.exec` with the per-command timeout; None (counted) when it ran past it, whichever
        way the backend reports that."""
        timeout = max(1, round(self.command_timeout))
        try:
            return await asyncio.wait_for(
                environment.exec(command, timeout_sec=timeout), self.command_timeout + TIMEOUT_GRACE_SECONDS
            )
        except TimeoutError:
            pass
        except RuntimeError as exc:
            # Docker and the local sandbox raise RuntimeError("... timed out after N seconds"); anything
            # else is the sandbox failing, not the model: let it discard the attempt.
            if "timed out" not in str(exc).lower():
                raise
        self.stats.timeouts += 1
        return None


def _arguments(raw: object) -> dict[str, object]:
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        if not isinstance(raw, str | bytes | bytearray):
            raise TypeError("json.loads reads only text")
        args = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        raise ValueError(f"arguments are not a JSON object: {clip(str(raw), 200)}") from None
    if not isinstance(args, dict):
        raise ValueError("arguments must be a JSON object")
    return args


def _string(args: dict[str, object], key: str) -> str:
    if key not in args:
        raise ValueError(f"missing argument {key!r}")
    value = args[key]
    if not isinstance(value, str):
        raise ValueError(f"argument {key!r} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")  # JSON allows lone surrogates; no sandbox command line does
    except UnicodeEncodeError:
        raise ValueError(f"argument {key!r} is not valid UTF-8 text") from None
    return value


def unparsed_calls_message(reply: Reply) -> str:
    reasons = "; ".join(reply.tool_call_errors)
    cut = reply.finish_reason == "length" and any("no closing" in e for e in reply.tool_call_errors)
    hint = " (the reply hit the token limit: keep tool calls short)" if cut else ""
    return (
        f"error: {len(reply.tool_call_errors)} tool call(s) could not be read{hint}: {reasons}. Write each call "
        'as <tool_call>{"name": "shell", "arguments": {"command": "..."}}</tool_call>.'
    )


def clip(text: str, limit: int) -> str:
    """`text` shortened to about `limit` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(f"\n[... {len(text)} characters omitted ...]\n"), 2)
    head, tail = keep // 2, keep - keep // 2
    return f"{text[:head]}\n[... {len(text) - keep} characters omitted ...]\n{text[len(text) - tail :]}"


def format_result(return_code: int, stdout: str, stderr: str, max_chars: int) -> str:
    """A command's result as the model reads it: exit code, then stdout and stderr within `max_chars`."""
    # stderr gets what stdout leaves, but never less than a quarter of the budget when it has that much.
    err_budget = min(len(stderr), max(max_chars - len(stdout), max_chars // 4))
    out_budget = max_chars - err_budget
    parts = [f"exit code: {return_code}"]
    if stdout:
        parts.append("stdout:\n" + clip(stdout, out_budget).rstrip("\n"))
    if stderr:
        parts.append("stderr:\n" + clip(stderr, err_budget).rstrip("\n"))
    if not stdout and not stderr:
        parts.append("(no output)")
    return "\n".join(parts)
