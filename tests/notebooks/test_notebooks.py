"""Every notebook runs once in the suite, under papermill with tiny parameters (one slow item per notebook).

papermill injects the SMOKE parameters and the test reads the saved output back, as a user reopening a
batch-run notebook would. Nothing else executes the notebooks (nbmake ran each one a second time; it went to
keep CI within its time), except the two the browser tests open in JupyterLab.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import nbformat
import papermill as pm
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (REPO / "notebooks").glob("*.ipynb") if not p.name.startswith("_"))

SMOKE: dict[str, dict] = {
    "index.ipynb": {},
    "model_families.ipynb": {},  # its tokenizers: `family_tokenizer_folders`
    "rl_quickstart.ipynb": {
        "max_steps": 2,
        "group_size": 4,
        "groups_per_step": 2,
        "max_tokens": 8,
        "eval_attempts": 4,
    },
    "pattern_local_openai.ipynb": {"max_steps": 2, "group_size": 4, "groups_per_step": 2, "max_tokens": 8},
    # Builds the verifiers environment (verifiers==0.4.0 from PyPI, or uv's cache) on first use.
    "pattern_verifiers.ipynb": {"max_steps": 1, "group_size": 4, "groups_per_step": 1, "max_tokens": 8},
    "pattern_in_process_tools.ipynb": {
        "max_steps": 1,
        "group_size": 2,
        "groups_per_step": 2,
        "max_tokens": 32,
    },
    "pattern_harbor_in_process_direct.ipynb": {
        "max_steps": 2,
        "group_size": 4,
        "groups_per_step": 1,
        "max_tokens": 8,
    },
    "pattern_harbor_local_openai.ipynb": {
        "max_steps": 1,
        "group_size": 2,
        "groups_per_step": 1,
        "max_tokens": 8,
    },
    "pattern_harbor_terminus_2.ipynb": {
        "max_steps": 1,
        "group_size": 2,
        "groups_per_step": 1,
        "max_tokens": 64,
        "max_turns": 1,
        "attempt_timeout_seconds": 300,
        # Seed 121: both attempts' first replies end within 20 tokens, so the smoke run takes about a minute.
        # At seed 0 the first reply runs past max_tokens and Terminus-2 re-asks until the attempt's timeout.
        "seed": 121,
    },
    "sft_tool_use.ipynb": {"max_steps": 1, "max_rows": 4, "eval_examples": 2, "compare_rows": 1},
    "sft_toucan.ipynb": {"max_steps": 1, "max_rows": 4, "eval_examples": 2, "compare_rows": 0},
    "tool_agent.ipynb": {
        "max_steps": 1,
        "group_size": 2,
        "groups_per_step": 3,
        "max_tokens": 32,
        "max_turns": 2,
    },
    "terminal_bench.ipynb": {"n_tasks": 2, "max_steps": 1, "run_training": False},
    "vision_counting.ipynb": {"max_steps": 1, "group_size": 4, "groups_per_step": 2, "tasks": 8},
    "compare_runs.ipynb": {
        "max_steps": 2,
        "group_size": 4,
        "groups_per_step": 2,
        "max_tokens": 8,
        "eval_attempts": 4,
    },
    "custom_loss.ipynb": {
        "max_steps": 1,
        "group_size": 4,
        "groups_per_step": 2,
        "max_tokens": 8,
        "answer": "o",
    },
}
EXPECT: dict[str, list[str]] = {
    "index.ipynb": ["rl_quickstart.ipynb\n  config = ", "  max_steps = ", "sft_tool_use.ipynb"],
    "rl_quickstart.ipynb": [
        "check: ok",
        "status: completed",
        "reward/mean: step 1 =",
        "eval reward: base model",
        "checkpoint: final-000002 (2 steps)",
        "held-out prompt, eval reward: base model",
    ],
    "pattern_local_openai.ipynb": ["model access openai_http", "status: completed", "reward/mean: step 1 ="],
    "pattern_verifiers.ipynb": [
        "verifiers 0.4.0, environment loops-hidden-game",
        "rubric HiddenGameTask: names_game",
        "check: ok",
        "status: completed",
        "reward/mean: step 1 =",
    ],
    "pattern_in_process_tools.ipynb": ["check: ok", "status: completed"],
    "pattern_harbor_in_process_direct.ipynb": [
        "check: ok",
        "status: completed",
        "released",
        "reward/mean: step 1 =",
    ],
    "pattern_harbor_local_openai.ipynb": ["model access openai_http", "status: completed", "released"],
    "pattern_harbor_terminus_2.ipynb": [
        "check: ok",
        "status: completed",
        "released",
        "Terminus-2 agent_kwargs: {'max_turns': 1,",
        "Terminus-2 to the model, call 1:",
        "Current Terminal Screen:",
    ],
    "sft_tool_use.ipynb": [
        "rows read: 4",
        "trained",
        "status: completed",
        "train loss: first",
        "accuracy: base",
    ],
    "sft_toucan.ipynb": ["rows read: 4", "status: completed", "train loss: first"],
    "tool_agent.ipynb": [
        "check: ok",
        "status: completed",
        "6 attempts: mean reward",
        "6 created, 6 released",
    ],
    "terminal_bench.ipynb": [
        "scope serverless",
        "schedule: 1 steps x 8 groups",
        "ready to train:",
        "not training:",
    ],
    "vision_counting.ipynb": [
        "image chunk: png",
        "8 image(s) costing 128 image tokens",
        "check: ok",
        "status: completed",
        "8 held-out task(s), 0 of them trained on",
    ],
    "compare_runs.ipynb": [
        "status: completed",
        "RunComparison(2 runs; reward/mean, eval/reward_mean, eval/pass_at_1, eval/pass_at_4)",
        "legend: ['learning_rate=0.0005', 'learning_rate=0.002']",
        "SideBySide(2 prompts; base:",
        "exported: PEFT adapter of sampler weights after step 2",
    ],
    "custom_loss.ipynb": ["largest LoRA weight difference", "loss: custom", "check: ok", "status: completed"],
    "model_families.ipynb": [
        "renderer: qwen3.6 (auto: Qwen/Qwen3.6-35B-A3B is a qwen3.6 model in `renderers`' table)",
        "template: qwen3 on a sample tool conversation: 2 model calls, 1 sequence break(s) per attempt (1 "
        "reasoning_dropped; reasoning dropped at the new user message, as the family's own template drops it)",
        "template: llama-3 on a sample tool conversation: 2 model calls, 0 sequence break(s) per attempt; tool call "
        "round trip ok",
        "== gpt-oss: openai/gpt-oss-20b",
        "SFT: 1 example(s)",  # Llama 3 and DeepSeek V4 (thinking) keep the whole row one example
        "split: the qwen3 renderer renders earlier turns differently",
        "TargetPreview(",
    ],
}


def family_tokenizer_folders(folder: Path) -> dict[str, str]:
    """The five families' tokenizers saved as folders (no Hub here), for model_families.ipynb; the kernel
    inherits TIKTOKEN_ENCODINGS_BASE, where Harmony finds gpt-oss's vocabulary."""
    import os

    from family_tokenizers import family_tokenizer, tiktoken_encodings_dir

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken_encodings_dir())
    folders = {}
    for name in ("qwen3", "qwen3.6", "llama-3", "deepseek-v4", "gpt-oss"):
        family_tokenizer(name).save_pretrained(folder / name)
        folders[name] = str(folder / name)
    return folders


MAX_OUTPUT_BYTES = 1_000_000
"""A saved notebook must stay small: no megabytes of widget state."""


def errors(nb: nbformat.NotebookNode) -> list[str]:
    """The cells' error outputs, and tracebacks or ERROR log lines on stderr. A model's text may say "ERROR"
    (Terminus-2's re-ask does), so the word in a reply or a transcript is no failure."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"{out['ename']}: {out['evalue']}")
            elif (
                out.get("output_type") == "stream"
                and out.get("name") == "stderr"
                and "Traceback" in out["text"]
            ):
                found.append(out["text"][-2000:])
    return found


def output_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif out.get("output_type") == "error":
                parts.append(f"ERROR {out['ename']}: {out['evalue']}")
            elif "data" in out:
                parts.append(str(out["data"].get("text/plain", "")))
                parts.append(str(out["data"].get("text/html", "")))
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_under_papermill(notebook: Path, tmp_path: Path) -> None:
    params = pm.inspect_notebook(str(notebook))
    smoke = {k: v for k, v in SMOKE.get(notebook.name, {}).items() if k in params}
    if notebook.name == "model_families.ipynb":
        smoke["tokenizers"] = family_tokenizer_folders(tmp_path / "tokenizers")
    if "run_name" in params:
        # Unique on every run: a name reused from an earlier session would resume (and skip) that run.
        smoke["run_name"] = f"papermill-{notebook.stem}-{uuid.uuid4().hex[:8]}"
    out = tmp_path / notebook.name
    pm.execute_notebook(
        str(notebook),
        str(out),
        parameters=smoke,
        kernel_name="python3",
        cwd=str(REPO),
        progress_bar=False,
        execution_timeout=900,
    )
    assert out.stat().st_size < MAX_OUTPUT_BYTES
    saved = nbformat.read(out, as_version=4)
    assert not errors(saved), f"{notebook.name}: {errors(saved)}"
    text = output_text(saved)
    for expected in EXPECT.get(notebook.name, []):
        assert expected in text, f"{notebook.name}: {expected!r} not in the saved output"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_parameterised(notebook: Path) -> None:
    raw = json.loads(notebook.read_text())
    nb = nbformat.reads(notebook.read_text(), as_version=4)
    nbformat.validate(nb)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    assert notebook.name in SMOKE, f"{notebook.name}: add its tiny parameters to SMOKE, so the suite runs it"
    assert notebook.name in EXPECT, f"{notebook.name}: add what its saved output must show to EXPECT"
    assert all(not c.get("outputs") for c in raw["cells"] if c["cell_type"] == "code"), (
        "commit notebooks without outputs"
    )
    assert pm.inspect_notebook(str(notebook)), "papermill finds the parameters"
