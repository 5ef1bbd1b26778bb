"""`loops eval` on a real embedded Loops (the tiny model): the base model, the run's latest checkpoint (its saved
sampler weights) and a periodic one (trainer state only), each evaluated with the config's `[eval]`, written
apart from the run's logs; and greedy evaluations agree with the ones the run made of the same policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import read_jsonl, run_cli_in_process
from tiny_models import build_tiny_chat_model

from loops_nb import load

RUNTIME = '''
from loops_nb.runtime import Evidence, Task


class Talk:
    """Three tasks; the reward is the attempt's index in its group plus a bit of the reply's length."""

    async def tasks(self):
        return [Task(str(i)) for i in range(3)]

    async def run_attempt(self, attempt):
        reply = await attempt.services.llm.chat([{"role": "user", "content": f"Say {attempt.task.id}."}])
        return Evidence(reward=float(attempt.index) + len(reply.text) % 4 / 8)

    async def close(self):
        pass
'''

CONFIG = """
recipe = "rl"
[model]
base_model = "{model}"
lora_rank = 4
[compute.local]
device = "cpu"
[runtime]
factory = "eval_command_runtime:Talk"
[sampling]
max_tokens = 6
[training]
max_steps = 2
group_size = 2
groups_per_step = 2
learning_rate = 1e-2
save_every = 1
reward_max = 10
[eval]
attempts = 2
temperature = 0
pass_threshold = 1
[output]
output_dir = "{out}"
run_name = "r"
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rl-eval")
    model = build_tiny_chat_model(folder / "model")
    (folder / "eval_command_runtime.py").write_text(RUNTIME)
    config = folder / "train.toml"
    config.write_text(CONFIG.format(model=model, out=folder / "runs"))
    outcome = load(config).train_sync(observers=[])
    assert outcome.status == "completed" and outcome.steps == 2
    return config


def _results(stdout: str) -> Path:
    return Path(
        next(line for line in stdout.splitlines() if line.startswith("results: ")).removeprefix("results: ")
    )


@pytest.mark.slow
def test_loops_eval_evaluates_the_base_model_and_checkpoints_apart_from_the_run(trained: Path) -> None:
    run = trained.parent / "runs" / "r"
    in_run = {e["step"]: e for e in read_jsonl(run / "evals.jsonl")}
    assert sorted(in_run) == [0, 2], "the run evaluated the base model and its final policy"
    logs = {name: (run / name).read_text() for name in ("steps.jsonl", "evals.jsonl", "eval_attempts.jsonl")}
    final = read_jsonl(run / "checkpoints.jsonl")[-1]

    for checkpoint, step, label in (
        ("latest", 2, "final-000002"),
        ("base", 0, "base"),
        ("1", 1, "state-000001"),
    ):
        code, out, err = run_cli_in_process("eval", trained, "--checkpoint", checkpoint)
        assert code == 0, err
        assert f"checkpoint: {label} ({step} steps)" in out
        assert "eval/reward_mean: " in out and "eval/pass_at_2: " in out
        results = _results(out)
        assert results.parent == run / "evals"
        (line,) = read_jsonl(results / "evals.jsonl")
        assert line["step"] == step and line["eval/tasks"] == 3 and line["eval/attempts"] == 6
        rows = read_jsonl(results / "eval_attempts.jsonl")
        assert len(rows) == 6 and all(r["discarded"] is None for r in rows), rows
        summary = json.loads((results / "summary.json").read_text())
        assert summary["checkpoint"] == label
        if checkpoint == "latest":
            assert summary["sampler_path"] == final["sampler_path"]
        if step in in_run:
            # Greedy, the same seeds and the same weights: what the run measured of this policy.
            assert line["eval/reward_mean"] == pytest.approx(in_run[step]["eval/reward_mean"])
            assert [r["reward"] for r in rows] == [
                r["reward"] for r in read_jsonl(run / "eval_attempts.jsonl") if r["step"] == step
            ]
    assert {name: (run / name).read_text() for name in logs} == logs, "the run's own logs are untouched"


def _sampled(results: Path) -> list[list[str]]:
    """Every attempt's completions, call by call, from the evaluation's transcript (special tokens and
    undecodable bytes kept as the transcript writes them)."""
    (transcript,) = sorted((results / "transcripts").glob("eval-*.json"))
    return [[call["completion"] for call in t["calls"]] for t in json.loads(transcript.read_text())]


@pytest.mark.slow
def test_a_state_checkpoint_evaluates_as_its_sampler_weights_twin_not_as_the_base_model(
    trained: Path,
) -> None:
    """The final step saved both trainer state (state-000002) and sampler weights (final-000002): the same
    weights, so the same eval seeds draw the same samples from either. `loops eval` once served a state
    checkpoint as the base model (it loaded the state without the optimizer, so it published at step 0)."""
    sampled, rewards = {}, {}
    for name in ("state-000002", "final-000002", "base"):
        code, out, err = run_cli_in_process("eval", trained, "--checkpoint", name)
        assert code == 0, err
        results = _results(out)
        sampled[name] = _sampled(results)
        rewards[name] = [r["reward"] for r in read_jsonl(results / "eval_attempts.jsonl")]
    assert sampled["state-000002"] == sampled["final-000002"]
    assert rewards["state-000002"] == rewards["final-000002"]
    assert sampled["state-000002"] != sampled["base"]


@pytest.mark.slow
def test_loops_eval_refuses_an_unknown_checkpoint_and_an_sft_config_in_one_line(trained: Path) -> None:
    code, _, err = run_cli_in_process("eval", trained, "--checkpoint", "nope")
    assert code == 2
    assert "no checkpoint 'nope'" in err and "final-000002" in err and "Traceback" not in err
    code, _, err = run_cli_in_process("eval", trained, "--output.run_name", "never-ran")
    assert code == 2 and "does not exist; no run to evaluate" in err
    sft = Path(__file__).resolve().parents[2] / "examples" / "sft_tool_use" / "sft_local.toml"
    code, _, err = run_cli_in_process("eval", sft)
    assert code == 2 and "evaluates RL configs" in err
