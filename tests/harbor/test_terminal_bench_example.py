"""examples/terminal_bench: `loops check` without credentials names exactly what is missing, as one line each.

Here there is no BASETEN_API_KEY, no Blaxel credentials and (under tests/conftest.py) no Hugging Face Hub:
the check must say so and exit non-zero, never with a traceback. The agent class must import cleanly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import import_file

from loops_nb import cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "terminal_bench" / "train.toml"
CREDENTIALS = ("BASETEN_API_KEY", "BL_API_KEY", "BL_CLIENT_CREDENTIALS", "BL_WORKSPACE", "BL_REGION")


def test_check_without_credentials_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.blaxel/config.yaml from a `bl login`
    monkeypatch.chdir(tmp_path)  # no .env from the working directory
    rc = cli.main(["check", str(CONFIG), "--output.output_dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()

    assert "Traceback" not in out + err
    assert rc == 1, "problems found: check exits 1 (2 is a config the loader refused)"
    problems = [line.removeprefix("problem: ") for line in out.splitlines() if line.startswith("problem: ")]
    assert f"check: {len(problems)} problem(s)" in out
    assert any("BASETEN_API_KEY" in p and ".env" in p for p in problems), problems
    assert any(p.startswith("providers.blaxel: ") and "BL_API_KEY and BL_WORKSPACE" in p for p in problems)
    assert not any("runtime.options.agent" in p for p in problems), "agent:TerminalBenchAgent imports"
    # Every line printed is a problem, a setting or the summary: nothing spills over from an exception.
    known = (
        "problem: ",
        "check: ",
        "Config: ",
        "  ",
        "recipe: ",
        "preflight: ",
        "runtime: ",
        "schedule: ",
        "renderer: ",
        "template: ",
    )
    assert all(line.startswith(known) for line in out.splitlines() if line), out
    assert "schedule: 50 steps x 8 groups x 8 attempts = 64 attempts a step, async" in out


def test_the_terminal_bench_agent_is_a_shell_agent_with_its_own_prompt(tmp_path: Path) -> None:
    # Loaded under its own name: other examples and patterns have an `agent` module too.
    module = import_file(CONFIG.parent / "agent.py", "terminal_bench_agent")
    TerminalBenchAgent, TERMINAL_BENCH_PROMPT = module.TerminalBenchAgent, module.TERMINAL_BENCH_PROMPT

    from loops_nb.harbor.shell_agent import ShellAgent

    assert issubclass(TerminalBenchAgent, ShellAgent)
    agent = TerminalBenchAgent(logs_dir=tmp_path, max_turns=40, command_timeout=180, max_output_chars=6000)
    assert agent.system_prompt == TERMINAL_BENCH_PROMPT
    assert (agent.max_turns, agent.command_timeout, agent.max_output_chars) == (40, 180.0, 6000)
    assert TerminalBenchAgent(logs_dir=tmp_path, system_prompt="Be terse.").system_prompt == "Be terse."


def test_a_tokenizer_that_cannot_load_is_one_actionable_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from loops_nb.model_renderer import tokenizer_problem

    offline = OSError(
        "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
        "cached files.\nCheck your internet connection or see how to run the library in offline mode at "
        "'https://huggingface.co/docs/transformers/installation#offline-mode'."
    )
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    line = tokenizer_problem("Qwen/Qwen3.6-35B-A3B", offline)
    assert "\n" not in line
    assert "not in the Hugging Face cache and huggingface.co is unreachable" in line
    assert "[model] tokenizer" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in tokenizer_problem("Qwen/Qwen3.6-35B-A3B", offline)

    monkeypatch.delenv("HF_HUB_OFFLINE")
    gated = OSError(
        "You are trying to access a gated repo.\nMake sure to have access to it. 401 Client Error."
    )
    line = tokenizer_problem("meta-llama/Llama-3.1-8B", gated)
    assert line == (
        "cannot load the tokenizer of 'meta-llama/Llama-3.1-8B': You are trying to access a gated repo. "
        "Gated or private repos need HF_TOKEN; a local directory works too ([model] tokenizer)"
    )
