"""Secrets: credentials planted as canaries never reach logs, run files, transcripts, sandboxes or agent
programs, and `loops check` never prints them."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_cli
from rl_config import tiny_run_toml

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"
CANARIES = {
    "BASETEN_API_KEY": "canary-baseten-7f3a9c",
    "HF_TOKEN": "canary-hf-52e1b0",
    "BL_API_KEY": "canary-blaxel-a81d44",
    "DAYTONA_API_KEY": "canary-daytona-e6b270",
    "WANDB_API_KEY": "canary-wandb-19fd3e",
}

PROGRAM = """
import json, os, sys
from openai import OpenAI
sys.stdin.read()
reply = OpenAI(timeout=120).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
print(json.dumps({"program_env": dict(os.environ)}))
"""

AGENT = """
from loops_nb.harbor.program_agent import LoopsProgramAgent


class EnvDumper(LoopsProgramAgent):
    async def run(self, instruction, environment, context):
        await super().run(instruction, environment, context)
        result = await environment.exec("env")
        self.transcript.append({"role": "tool", "content": "SANDBOX_ENV " + (result.stdout or "")})
"""


def files_containing(root: Path, needles: list[str]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_run_never_writes_or_passes_on_its_credentials(tmp_path: Path, tiny_chat_model_path: Path) -> None:
    pytest.importorskip("harbor")
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "dumper.py").write_text(AGENT)
    config = tmp_path / "train.toml"
    config.write_text(
        tiny_run_toml(
            "loops_nb.harbor:create_runtime",
            tiny_chat_model_path,
            tmp_path / "runs",
            options={
                "tasks": HIDDEN_GAME,
                "agent": "dumper:EnvDumper",
                "model_access": "openai_http",
                "keep_trials": "all",
                "agent_kwargs": {"command": ["python", "program.py"]},
            },
            sampling={"max_tokens": 2},
            training={"group_size": 2},
            output={"run_name": "canary", "trace": "full"},
        )
    )
    done = run_cli("-v", "run", config, cwd=tmp_path, env={**CANARIES, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "canary"
    everything = "\n".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())
    # The test can fail: the program's and the sandbox's environments really are recorded in the run.
    assert "OPENAI_BASE_URL" in everything and "SANDBOX_ENV" in everything and "PATH=" in everything
    canaries = list(CANARIES.values())
    assert files_containing(run, canaries) == []
    assert not [c for c in canaries if c in done.stdout or c in done.stderr]
    assert "DEBUG harbor" not in done.stderr, "Harbor's DEBUG loggers are quieted"


@pytest.mark.parametrize(
    "config",
    [
        "patterns/custom_runtime/in_process_direct/train.toml",
        "patterns/harbor/in_process_direct/train_blaxel.toml",
        "patterns/harbor/in_process_direct/train_daytona.toml",
    ],
)
def test_loops_check_never_prints_credentials(config: str, tmp_path: Path) -> None:
    done = run_cli(
        "check",
        REPO / config,
        "--output.output_dir",
        tmp_path,
        cwd=tmp_path,
        env={**CANARIES, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert "Traceback" not in done.stderr
    output = done.stdout + done.stderr
    assert not [c for c in CANARIES.values() if c in output], output[-2000:]
    assert files_containing(tmp_path, list(CANARIES.values())) == []


def test_agent_programs_get_their_lease_not_the_runs_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from loops_nb.model_access import agent_process_env

    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    attempt = SimpleNamespace(
        services=SimpleNamespace(model_base_url="http://127.0.0.1:9/v1", model_api_key="lease-1")
    )
    env = agent_process_env(attempt)  # type: ignore[arg-type]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and env["OPENAI_API_KEY"] == "lease-1"
    assert not set(CANARIES) & set(env)
    assert "127.0.0.1" in env["NO_PROXY"]


POSITIVE_CONTROL = {
    "cells": [
        {
            "cell_type": "code",
            "id": "leak",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": "import os\nprint(os.environ['BASETEN_API_KEY'], os.environ['BL_API_KEY'])",
        }
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}
NOTEBOOKS = {
    # The same tiny parameters as tests/notebooks/test_notebooks.py; run_name fixes where the run is written.
    # sft_tool_use.ipynb (max_steps 1, max_rows 4, compare_rows 0) passes too, but took 264 s here against
    # 160 s for this one on two shared cores, so it is left out to keep the file near two minutes.
    "rl_quickstart.ipynb": {"max_steps": 2, "group_size": 4, "groups_per_step": 2, "max_tokens": 8},
}


def _plant_canaries(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    # LOOPS_BASE_URL would point the local scope at a `loops serve`; without it, an embedded Loops must start.
    monkeypatch.delenv("LOOPS_BASE_URL", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _execute(source: Path, out: Path, parameters: dict, cwd: Path) -> None:
    import papermill as pm

    pm.execute_notebook(
        str(source),
        str(out),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(cwd),
        progress_bar=False,
        execution_timeout=600,
    )


def test_a_notebook_kernel_sees_the_canaries_and_the_scan_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test below: the kernel inherits the planted credentials, and a notebook that does
    print one is caught by the same scan. Without it, the test below could pass by never planting anything."""
    import nbformat

    pytest.importorskip("papermill")
    _plant_canaries(monkeypatch)
    source = tmp_path / "leak.ipynb"
    nbformat.write(nbformat.from_dict(POSITIVE_CONTROL), source)
    out = tmp_path / "out" / "leak.ipynb"
    out.parent.mkdir()
    _execute(source, out, {}, tmp_path)
    assert files_containing(out.parent, list(CANARIES.values())) == [
        f"{out}: {CANARIES['BASETEN_API_KEY']}",
        f"{out}: {CANARIES['BL_API_KEY']}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS))
def test_a_notebook_never_saves_its_credentials(
    notebook: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook run with every credential planted (papermill, tiny parameters, the local scope): no canary in
    the saved .ipynb (outputs, widget state, metadata) nor in the run directory; and BASETEN_API_KEY set does not
    move the local scope off its embedded Loops."""
    pytest.importorskip("papermill")
    _plant_canaries(monkeypatch)
    out = tmp_path / notebook
    # cwd is tmp_path: the configs' relative output_dir ("runs") lands there, and nothing else is written.
    _execute(REPO / "notebooks" / notebook, out, {**NOTEBOOKS[notebook], "run_name": "canary"}, tmp_path)
    saved = out.read_text()
    assert "status: completed" in saved and "scope local" in saved
    run = tmp_path / "runs" / "canary"
    run_json = (run / "run.json").read_text()
    assert '"scope": "local"' in run_json
    assert (run / "state" / "local_loops").is_dir(), "the embedded Loops ran, not Baseten"
    assert files_containing(tmp_path, list(CANARIES.values())) == []
