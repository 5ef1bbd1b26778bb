"""A killed RL run resumes at its last checkpoint and applies every optimizer step exactly once.

One uninterrupted reference run of the config (the tiny model, 8 steps, save_every 1) is trained in-process,
once for the module. Then, for each of three seeds, `loops run` trains the same config in a process of its
own that is SIGKILLed at a random moment picked by the seed: a random fraction of a step after its n-th step
record appears (n random too), so the kill lands anywhere in what follows: sampling, forward_backward,
publishing, a checkpoint save or a JSONL append; sometimes before the first checkpoint, so the run starts
over. One seed kills the resumed run a second time before it finishes (a double crash), and before that
resume leaves a half record at the end of every log, as a kill inside a long append would. The run is then
resumed in-process to the end and compared with the reference: every step recorded once and in order, the
same optimizer-step count (the policy version of every step, and the trainer's own step count in the final
checkpoint), the same tasks in every step, whole JSONL lines only, checkpoints that increase and are all
complete (also right after each kill), and one more Loops run id in run.json's run_ids per killed process.

The runtime rewards an attempt by its index in the group, so every group has variance and every step
trains: the optimizer-step count is then the same in any correct run, whatever was sampled. The kills are
`tests/crash_harness.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crash_harness import SEEDS, Setup, assert_whole_logs, crash, resume_to_end, trainer_step
from helpers import read_jsonl
from rl_config import tiny_run_toml
from tiny_models import build_tiny_chat_model

from loops_nb import load

RUNTIME = '''
from loops_nb.runtime import Evidence, Task


class Steady:
    """Five tasks; the reward is the attempt's index in its group, so every group trains."""

    async def tasks(self):
        return [Task(str(i)) for i in range(5)]

    async def run_attempt(self, attempt):
        reply = await attempt.services.llm.chat([{"role": "user", "content": "Talk."}], max_tokens=8)
        return Evidence(reward=float(attempt.index) + len(reply.text) % 4 / 8)

    async def close(self):
        pass
'''

MAX_STEPS = 8
GROUPS, GROUP_SIZE = 2, 4


def final_trainer_step(run: Path) -> int:
    """The optimizer steps the trainer had applied at the run's last checkpoint (its own count)."""
    return trainer_step(run, read_jsonl(run / "checkpoints.jsonl")[-1]["path"])


def tasks_per_step(run: Path) -> list[list[tuple]]:
    by_step: list[list[tuple]] = [[] for _ in range(MAX_STEPS)]
    for r in read_jsonl(run / "rollouts.jsonl"):
        by_step[r["step"]].append((r["group"], r["task"], r["attempt"]))
    return by_step


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    folder = tmp_path_factory.mktemp("rl-resume")
    model = build_tiny_chat_model(folder / "model")
    (folder / "steady_resume_runtime.py").write_text(RUNTIME)
    config = folder / "train.toml"
    config.write_text(
        tiny_run_toml(
            "steady_resume_runtime:Steady",
            model,
            folder / "runs",
            training={
                "max_steps": MAX_STEPS,
                "group_size": GROUP_SIZE,
                "groups_per_step": GROUPS,
                "learning_rate": 1e-3,
                "save_every": 1,
                "reward_max": 10,
            },
        )
    )
    outcome = load(config, overrides={"output.run_name": "reference"}).train_sync(observers=[])
    assert outcome.status == "completed" and outcome.steps == MAX_STEPS
    return Setup(folder, config, Path(outcome.run_dir))


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "kills"), SEEDS, ids=[f"seed{s}-{k}kill" for s, k in SEEDS])
def test_a_killed_run_resumes_exactly_once(setup: Setup, seed: int, kills: int) -> None:
    run = setup.folder / "runs" / f"killed-{seed}"
    killed_ids = crash(setup.config, run, setup.folder, seed, kills, MAX_STEPS)

    outcome = resume_to_end(setup.config, run)
    assert outcome.steps == MAX_STEPS

    steps, reference = read_jsonl(run / "steps.jsonl"), read_jsonl(setup.reference / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(MAX_STEPS)), "every step exactly once, in order"
    assert [s["step"] for s in reference] == list(range(MAX_STEPS))
    # The policy version counts optimizer steps: one per step here, as in the uninterrupted run.
    assert all(s["trained"] for s in steps + reference)
    assert [s["policy_version"] for s in steps] == [s["policy_version"] for s in reference]
    assert [s["policy_version"] for s in steps] == list(range(1, MAX_STEPS + 1))
    assert final_trainer_step(run) == final_trainer_step(setup.reference) == MAX_STEPS

    # Data order: every step saw the tasks (per group, per attempt) that the reference's step saw.
    assert tasks_per_step(run) == tasks_per_step(setup.reference)
    rollouts = read_jsonl(run / "rollouts.jsonl")
    assert len(rollouts) == MAX_STEPS * GROUPS * GROUP_SIZE
    assert [r["step"] for r in rollouts] == sorted(r["step"] for r in rollouts)

    assert_whole_logs(run)
    checkpoints = read_jsonl(run / "checkpoints.jsonl")
    assert checkpoints[-1]["step"] == MAX_STEPS and checkpoints[-1]["sampler_path"]
    assert all(c["step"] == c["extra"]["policy_version"] for c in checkpoints)
    meta = json.loads((run / "run.json").read_text())
    assert meta["run_ids"][:-1] == killed_ids, "run.json keeps the Loops run id of every killed process"
    assert meta["run_id"] == killed_ids[0], "run_id names the first Loops run, never a later one"
