"""`ShellAgent` without a model: a scripted LLM drives it against a real local (bubblewrap) sandbox.

The scripted replies are what a policy under training writes, good and bad: commands that succeed and
fail, files with quotes, `$`, newlines and a heredoc terminator in them, calls to unknown tools, bad
arguments, `<tool_call>` blocks that do not parse, commands that hang, output far over the budget. Each
must come back to the model as a tool result, and the loop must stop exactly when the model answers
without a tool call or runs out of turns.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harbor.environments.base import ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from loops_nb.harbor.agent import forget_attempt, register_attempt
from loops_nb.harbor.shell_agent import (
    DEFAULT_SYSTEM_PROMPT,
    WRITE_CHUNK_CHARS,
    ShellAgent,
    clip,
    format_result,
)
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, Reply, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.providers.local import LocalSandboxEnvironment

pytestmark = pytest.mark.bwrap


def call(name: str, arguments: Any, i: int = 0) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def tool_reply(*calls: dict[str, Any], errors: list[str] | None = None, finish: str = "stop") -> Reply:
    return Reply("", list(calls), "", finish, 10, errors or [])


def answer(text: str) -> Reply:
    return Reply(text, [], text, "stop", 5)


class ScriptedLLM:
    """An object with the `chat` of `LoopsLLM`: returns scripted replies, records what it was sent."""

    def __init__(self, replies: list[Reply], *, repeat_last: bool = False) -> None:
        self.replies = list(replies)
        self.repeat_last = repeat_last
        self.requests: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    async def chat(self, messages: list[dict[str, Any]], *, tools: Any = None, **_: Any) -> Reply:
        self.requests.append((json.loads(json.dumps(messages)), tools))
        if self.repeat_last and len(self.replies) == 1:
            return self.replies[0]
        return self.replies.pop(0)


@pytest.fixture
async def sandbox(tmp_path: Path) -> Any:
    """A started local sandbox (what Harbor's trial hands the agent), removed afterwards."""
    (tmp_path / "env").mkdir()
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    env = LocalSandboxEnvironment(
        environment_dir=tmp_path / "env",
        environment_name="shell-agent-test",
        session_id="shell-agent-test__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir="/app"),
        scratch_dir=str(tmp_path / "scratch"),
    )
    await env.start(force_build=False)
    yield env
    await env.stop(delete=True)


def make_agent(tmp_path: Path, llm: ScriptedLLM, **agent_kwargs: Any) -> ShellAgent:
    attempt = SimpleNamespace(id="task/g0/a0", services=SimpleNamespace(llm=llm, capture=TokenCapture()))
    key = register_attempt(attempt)  # type: ignore[arg-type]
    try:
        # Harbor builds agents from JSON kwargs: pass them through JSON as it does.
        return ShellAgent(
            logs_dir=tmp_path / "agent", loops_attempt=key, **json.loads(json.dumps(agent_kwargs))
        )
    finally:
        forget_attempt(key)


def host(env: LocalSandboxEnvironment, path: str) -> Path:
    return env._require().host_path(path)


def stats_of(agent: ShellAgent, context: AgentContext) -> dict[str, Any]:
    """What Harbor records after the run: it fills the (still empty) context from the agent."""
    assert context.is_empty(), "the agent leaves the context to Harbor, which fills only an empty one"
    agent.populate_context_post_run(context)
    assert "loops_transcript" in context.metadata
    return context.metadata["shell_agent"]


def tool_results(agent: ShellAgent) -> list[str]:
    return [m["content"] for m in agent.transcript if m["role"] == "tool"]


async def test_it_runs_commands_writes_files_and_stops_when_the_model_answers(sandbox, tmp_path) -> None:
    tricky = "line 1\n'single' \"double\" $HOME `date` \\n\nEOF\n<<'EOF'\n\ttab\n"
    llm = ScriptedLLM(
        [
            tool_reply(call("shell", {"command": "echo hello > a.txt && cat a.txt && pwd"})),
            tool_reply(call("write_file", {"path": "sub dir/b.txt", "content": tricky})),
            tool_reply(
                call("shell", {"command": "cat 'sub dir/b.txt' | wc -c"}, 0),
                call("shell", {"command": "ls /nonexistent"}, 1),
            ),
            answer("Done: a.txt and sub dir/b.txt exist."),
            answer("never sent"),
        ]
    )
    agent = make_agent(tmp_path, llm)
    context = AgentContext()
    await agent.run("  Make two files.  ", sandbox, context)

    assert len(llm.requests) == 4, "the answer without a tool call ends the loop"
    assert host(sandbox, "/app/a.txt").read_text() == "hello\n"
    assert host(sandbox, "/app/sub dir/b.txt").read_text() == tricky, "write_file writes the bytes exactly"
    results = tool_results(agent)
    assert results[0] == "exit code: 0\nstdout:\nhello\n/app"
    assert results[1] == f"wrote {len(tricky.encode())} bytes to sub dir/b.txt"
    assert results[2] == f"exit code: 0\nstdout:\n{len(tricky.encode())}"
    assert results[3].startswith("exit code: 2\nstderr:\nls: cannot access '/nonexistent'")

    roles = [m["role"] for m in agent.transcript]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert agent.transcript[0]["content"] == DEFAULT_SYSTEM_PROMPT
    assert agent.transcript[1]["content"] == "Make two files."
    assert [m["tool_call_id"] for m in agent.transcript if m["role"] == "tool"] == ["call_0"] * 3 + ["call_1"]
    assert agent.transcript[-1] == {"role": "assistant", "content": "Done: a.txt and sub dir/b.txt exist."}
    # Each request is the whole conversation so far, with both tools offered every time.
    sent, tools = llm.requests[2]
    assert sent == agent.transcript[:6]
    assert [t["function"]["name"] for t in tools] == ["shell", "write_file"]
    stats = stats_of(agent, context)
    assert stats == {
        "turns": 4,
        "tool_calls": 4,
        "tool_errors": 0,
        "commands": 3,
        "nonzero_exits": 1,
        "timeouts": 0,
        "files_written": 1,
        "stop": "answered",
    }


async def test_malformed_calls_are_answered_not_raised(sandbox, tmp_path) -> None:
    llm = ScriptedLLM(
        [
            tool_reply(
                call("rm_rf", {"path": "/"}, 0),
                call("shell", "{not json", 1),
                call("shell", {"cmd": "ls"}, 2),
                call("write_file", {"path": "x.txt", "content": 42}, 3),
                call("shell", "[1, 2]", 4),
                call("shell", {"command": "   "}, 5),
                call("write_file", '{"path": "y.txt", "content": "\\ud800"}', 6),
            ),
            # Blocks the parser could not read: no call ids, so the agent answers in a user turn.
            Reply(
                "",
                [],
                '<tool_call>\n{"name": "shell", "argu',
                "length",
                9,
                ["tool call 0: no closing </tool_call>"],
            ),
            Reply(
                "", [], '<tool_call>{"name": shell}</tool_call>', "stop", 9, ["tool call 0: not valid JSON"]
            ),
            answer("giving up"),
        ]
    )
    agent = make_agent(tmp_path, llm, system_prompt="")
    context = AgentContext()
    await agent.run("do it", sandbox, context)

    assert agent.transcript[0] == {"role": "user", "content": "do it"}, 'system_prompt = "" sends none'
    assert tool_results(agent) == [
        "error: unknown tool 'rm_rf'; the tools are shell and write_file",
        "error: arguments are not a JSON object: {not json",
        "error: missing argument 'command'",
        "error: argument 'content' must be a string, got int",
        "error: arguments must be a JSON object",
        "error: command is empty",
        "error: argument 'content' is not valid UTF-8 text",
    ]
    cut_off, cut_feedback, bad_json, json_feedback = agent.transcript[-5:-1]
    # The unreadable reply stays as sampled, so the next prompt extends its exact tokens.
    assert cut_off == {"role": "assistant", "content": '<tool_call>\n{"name": "shell", "argu'}
    assert cut_feedback["role"] == "user"
    assert cut_feedback["content"].startswith(
        "error: 1 tool call(s) could not be read (the reply hit the token limit"
    )
    assert "no closing </tool_call>" in cut_feedback["content"]
    assert bad_json == {"role": "assistant", "content": '<tool_call>{"name": shell}</tool_call>'}
    assert json_feedback["content"].startswith(
        "error: 1 tool call(s) could not be read: tool call 0: not valid"
    )
    assert len(llm.requests) == 4, "an unreadable call is not an answer: the loop went on"
    assert not host(sandbox, "/app/x.txt").exists()
    stats = stats_of(agent, context)
    assert (stats["tool_calls"], stats["tool_errors"], stats["commands"], stats["stop"]) == (
        7,
        9,
        0,
        "answered",
    )


async def test_a_hanging_command_times_out_and_the_agent_goes_on(sandbox, tmp_path) -> None:
    llm = ScriptedLLM(
        [
            tool_reply(call("shell", {"command": "sleep 30; echo late > late.txt"})),
            tool_reply(call("shell", {"command": "echo after"})),
            answer("ok"),
        ]
    )
    agent = make_agent(tmp_path, llm, command_timeout=1)
    context = AgentContext()
    started = asyncio.get_running_loop().time()
    await agent.run("wait", sandbox, context)
    assert asyncio.get_running_loop().time() - started < 15
    assert tool_results(agent) == [
        "error: the command timed out after 1 seconds and was stopped",
        "exit code: 0\nstdout:\nafter",
    ]
    assert not host(sandbox, "/app/late.txt").exists(), "the timed-out command was killed"
    assert stats_of(agent, context)["timeouts"] == 1


async def test_output_is_truncated_in_the_middle(sandbox, tmp_path) -> None:
    llm = ScriptedLLM(
        [tool_reply(call("shell", {"command": "seq 1 100000; echo oops >&2; exit 3"})), answer("ok")]
    )
    agent = make_agent(tmp_path, llm, max_output_chars=300)
    await agent.run("count", sandbox, AgentContext())
    (result,) = tool_results(agent)
    assert len(result) <= 300 + len("exit code: 3\nstdout:\n\nstderr:\n")
    assert result.startswith("exit code: 3\nstdout:\n1\n2\n3\n")
    assert "characters omitted ...]" in result
    assert "99999\n100000\nstderr:\noops" in result, "the end of stdout and all of a short stderr are kept"


async def test_it_stops_after_max_turns(sandbox, tmp_path) -> None:
    llm = ScriptedLLM([tool_reply(call("shell", {"command": "echo x >> log.txt"}))], repeat_last=True)
    agent = make_agent(tmp_path, llm, max_turns=3)
    context = AgentContext()
    await agent.run("loop forever", sandbox, context)
    assert len(llm.requests) == 3
    assert host(sandbox, "/app/log.txt").read_text() == "x\nx\nx\n"
    assert agent.transcript[-1]["role"] == "tool", "the last tool result is kept"
    assert stats_of(agent, context)["stop"] == "max_turns"


async def test_large_files_are_written_in_pieces(sandbox, tmp_path) -> None:
    content = "".join(f"{i:07d} ünïcode 'q' \"d\" $x\n" for i in range(12_000))  # ~4 chunks, > 128 KiB
    assert len(content) > 3 * WRITE_CHUNK_CHARS
    llm = ScriptedLLM(
        [tool_reply(call("write_file", {"path": "/app/deep/er/big.txt", "content": content})), answer("ok")]
    )
    agent = make_agent(tmp_path, llm)
    await agent.run("write", sandbox, AgentContext())
    assert host(sandbox, "/app/deep/er/big.txt").read_text() == content
    assert tool_results(agent) == [f"wrote {len(content.encode())} bytes to /app/deep/er/big.txt"]


async def test_a_write_the_sandbox_refuses_is_an_error_result(sandbox, tmp_path) -> None:
    llm = ScriptedLLM(
        [tool_reply(call("write_file", {"path": "/usr/bin/evil", "content": "x"})), answer("ok")]
    )
    agent = make_agent(tmp_path, llm)
    context = AgentContext()
    await agent.run("write", sandbox, context)
    (result,) = tool_results(agent)
    assert result.startswith("error: could not write /usr/bin/evil: ")
    assert "Read-only file system" in result
    assert stats_of(agent, context)["files_written"] == 0


class BrokenSandbox:
    """A sandbox whose backend fails (a lost connection), not the model's command."""

    async def exec(self, command: str, **_: Any) -> ExecResult:
        raise RuntimeError("sandbox connection lost")


async def test_a_failing_sandbox_raises_so_the_attempt_is_discarded(tmp_path) -> None:
    llm = ScriptedLLM([tool_reply(call("shell", {"command": "ls"})), answer("ok")])
    agent = make_agent(tmp_path, llm)
    context = AgentContext()
    with pytest.raises(RuntimeError, match="sandbox connection lost"):
        await agent.run("ls", BrokenSandbox(), context)  # type: ignore[arg-type]
    assert stats_of(agent, context)["stop"] == "running"
    assert agent.transcript[-1]["role"] == "assistant", "the turn that was running is in the transcript"


def test_agent_kwargs_are_checked(tmp_path) -> None:
    llm = ScriptedLLM([])
    agent = make_agent(
        tmp_path, llm, max_turns=7, command_timeout=2.5, max_output_chars=500, system_prompt="Be brief."
    )
    assert (agent.max_turns, agent.command_timeout, agent.max_output_chars, agent.system_prompt) == (
        7,
        2.5,
        500,
        "Be brief.",
    )
    assert ShellAgent.name() == "loops-shell-agent"
    for bad in ({"max_turns": 0}, {"command_timeout": 0}, {"max_output_chars": 10}, {"max_turns": "many"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_agent(tmp_path, llm, **bad)
    # A misspelt option fails when Harbor builds the agent, instead of being silently ignored.
    with pytest.raises(ValueError, match="Unknown option 'max_turn'"):
        make_agent(tmp_path, llm, max_turn=3)


def test_clip_and_format_keep_both_ends_within_budget() -> None:
    text = "".join(chr(97 + i % 26) for i in range(5000))
    clipped = clip(text, 400)
    assert len(clipped) <= 400
    assert clipped.startswith(text[:150]) and clipped.endswith(text[-150:])
    assert clip("short", 400) == "short"
    assert format_result(0, "", "", 1000) == "exit code: 0\n(no output)"
    long_err = "E" * 5000
    formatted = format_result(1, "o" * 5000, long_err, 1000)
    out, err = formatted.split("\nstderr:\n")
    assert len(out) < 800 and 200 <= len(err) <= 250, "stderr keeps a quarter of the budget"


async def test_every_turn_extends_the_exact_sampled_tokens(sandbox, tmp_path) -> None:
    """Through the real LoopsLLM: tool calls, an unreadable call and tool results make ONE training
    sequence, in which exactly the sampled tokens train and the sandbox's answers are context."""
    from scripted_policy import ScriptedPolicy
    from tiny_models import build_tiny_tokenizer

    renderer = ChatRenderer(build_tiny_tokenizer())
    script = [
        '<tool_call>\n{"name": "shell", "arguments": {"command": "echo from-the-sandbox"}}\n</tool_call>',
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "n.txt"\n</tool_call>',
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "n.txt", "content": "7"}}\n</tool_call>',
        "Wrote 7 to n.txt.",
    ]
    capture = TokenCapture()
    real = LoopsLLM(
        renderer, ScriptedPolicy(renderer, script, logprob=-0.5), capture, SamplingDefaults(max_tokens=64)
    )
    agent = make_agent(tmp_path, ScriptedLLM([]))
    agent.attempt.services.llm = real  # type: ignore[union-attr]
    await agent.run("Write 7 to n.txt.", sandbox, AgentContext())

    assert host(sandbox, "/app/n.txt").read_text() == "7"
    assert [m["role"] for m in agent.transcript] == [
        *["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    ]
    assert not capture.breaks, "every prompt extends the previous prompt + completion exactly"
    [sequence] = capture.sequences()
    trained = [t for t, s in zip(sequence.tokens, sequence.sampled, strict=True) if s]
    assert trained == [t for call in capture.calls for t in call.completion_tokens]
    context = renderer.decode([t for t, s in zip(sequence.tokens, sequence.sampled, strict=True) if not s])
    assert "from-the-sandbox" in context and "could not be read" in context and "wrote 1 bytes" in context
