"""The Terminal-Bench agent: `ShellAgent` with a system prompt for long, hard terminal tasks.

    uv run loops run examples/terminal_bench/train.toml

Everything else (the `shell` and `write_file` tools, the turn loop, truncation, timeouts, the transcript)
is `loops_nb.harbor.shell_agent.ShellAgent`; `[runtime.options.agent_kwargs]` sets `max_turns`,
`command_timeout` and `max_output_chars`. A `system_prompt` there replaces this one.
"""

from __future__ import annotations

from typing import Any

from loops_nb.harbor.shell_agent import ShellAgent

TERMINAL_BENCH_PROMPT = """\
You are an expert software engineer solving a task in a Linux container through tools. Nobody will answer \
questions: work autonomously until the task is done.

- shell runs one bash command in the task's working directory. Every command starts a fresh shell: files \
persist, but `cd`, exported variables and background processes do not, so chain with && and use absolute \
paths. A command that runs too long is stopped; never start an interactive program (editors, pagers, REPLs, \
`less`, `top`); pass flags such as -y and pipe output through `head` or `tail` when it may be long.
- write_file creates or overwrites a whole file; use it for source files and scripts rather than echo or sed.

First explore (ls, cat, the README, existing tests), then make the change, then verify it the way the task \
will be checked: run the program, the tests, or the exact command the task names. Hidden tests grade the \
final state of the container, not your reply. When everything is done and verified, reply with a one-line \
summary and no tool call."""


class TerminalBenchAgent(ShellAgent):
    """`ShellAgent` with `TERMINAL_BENCH_PROMPT` as its default system prompt."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("system_prompt", TERMINAL_BENCH_PROMPT)
        super().__init__(*args, **kwargs)

    @staticmethod
    def name() -> str:
        return "loops-terminal-bench-agent"
