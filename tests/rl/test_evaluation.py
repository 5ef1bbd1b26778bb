"""RL evaluation (`[eval]`): eval attempts run through the training runtime's path and never reach the trainer,
on the configured cadence, recorded apart from the training logs, and not redone by a resumed run.

The trainer and sampler are test_faults.py's scripted ones: the sampler answers "Monopoly" on even calls, so
groups have reward variance and train; the trainer here also fails the test if a datum holds an eval prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl
from test_faults import QUICKSTART, ScriptedSampler, ScriptedTrainer

from loops_nb import load
from loops_nb.episodes import Episode, EpisodeRuntime, Task
from loops_nb.errors import RunFailed, UserError
from loops_nb.llm.client import llm
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.observers import ObserverSet
from loops_nb.rl.evaluation import choose_tasks, eval_due, pass_at_k, split_holdout
from loops_nb.rl.loop import RLRun
from loops_nb.rl.outcome import RLOutcome
from loops_nb.rl.policy import Policy
from loops_nb.run_dir import RunDirectory
from loops_nb.run_events import EvalRecord

TASKS = 6


class Quiz(Episode):
    """Six tasks whose prompts carry their set's label, so a datum tells which set it came from."""

    def __init__(self, label: str = "train") -> None:
        super().__init__(label=label)
        self.label = label

    def tasks(self) -> list[Task]:
        return [Task(id=f"{self.label}-{i}", data={"i": i}) for i in range(TASKS)]

    async def run(self, task: Task) -> float:
        reply = await llm().chat(
            [{"role": "user", "content": f"[{self.label}] Name board game {task.data['i']}."}]
        )
        return 1.0 if "monopoly" in reply.content.lower() else 0.0


class RecordingTrainer(ScriptedTrainer):
    """Keeps the decoded prompt of every datum it is sent; one holding an eval prompt fails the test."""

    def __init__(self, sampler: ScriptedSampler, renderer: ChatRenderer, **faults: Any) -> None:
        super().__init__(sampler, **faults)
        self.renderer = renderer
        self.prompts: list[str] = []

    async def forward_backward_async(
        self, data: Any, loss_fn: str = "cross_entropy", loss_fn_config: Any = None
    ) -> Any:
        for datum in data:
            text = self.renderer.decode(datum.model_input.to_ints())
            assert "[heldout]" not in text, f"an eval attempt reached the trainer: {text!r}"
            self.prompts.append(text)
        return await super().forward_backward_async(data, loss_fn, loss_fn_config)


def renderer() -> ChatRenderer:
    from loops_nb.model_renderer import load_model_tokenizer

    config = load(QUICKSTART).config
    return ChatRenderer(load_model_tokenizer(config.model, "local"))


def make_run(
    tmp_path: Path,
    trainer: ScriptedTrainer,
    chat: ChatRenderer,
    *,
    held_out_runtime: bool = True,
    observers: Sequence[object] = (),
    training: dict[str, Any] | None = None,
    **settings: Any,
) -> RLRun:
    overrides = {
        "output.output_dir": str(tmp_path),
        "training.max_steps": 4,
        "training.group_size": 2,
        "training.groups_per_step": 2,
        "training.save_every": 1,
        "eval.attempts": 2,
        "eval.every": 2,
        **({"eval.options": {"label": "heldout"}} if held_out_runtime else {}),
        **{f"eval.{k}": v for k, v in settings.items()},
        **{f"training.{k}": v for k, v in (training or {}).items()},
    }
    config = load(QUICKSTART, overrides=overrides).config
    return RLRun(
        config,
        RunDirectory(tmp_path / "run"),
        Policy(trainer, "scripted"),
        EpisodeRuntime(Quiz("train")),
        chat,
        ObserverSet(observers),
        eval_runtime=EpisodeRuntime(Quiz("heldout")) if held_out_runtime else None,
    )


@pytest.fixture(scope="module")
def chat() -> ChatRenderer:
    return renderer()


class Evals:
    """An observer keeping what `on_eval` gave it."""

    def __init__(self) -> None:
        self.lines: list[EvalRecord] = []

    def on_eval(self, evaluation: EvalRecord) -> None:
        self.lines.append(evaluation)


async def test_eval_attempts_never_reach_the_trainer_and_are_recorded_apart(
    tmp_path: Path, chat: ChatRenderer
) -> None:
    sampler = ScriptedSampler()
    trainer = RecordingTrainer(sampler, chat)
    seen = Evals()
    run = make_run(tmp_path, trainer, chat, observers=[seen])
    outcome = await run.execute(0)
    assert outcome.status == "completed"
    root = tmp_path / "run"

    # The cadence: the base model before step 0, every 2 steps, and the final policy after step 4.
    evals = read_jsonl(root / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert [e["eval/policy_version"] for e in evals] == [0, 2, 4]
    assert [line.step for line in seen.lines] == [0, 2, 4]
    assert [line.to_json() for line in seen.lines] == evals, "each on_eval carries its evals.jsonl line"
    eval_rows = read_jsonl(root / "eval_attempts.jsonl")
    assert len(eval_rows) == 3 * TASKS * 2
    assert {r["task"] for r in eval_rows} == {f"heldout-{i}" for i in range(TASKS)}
    assert all(r["step"] in (0, 2, 4) for r in eval_rows)
    for e in evals:  # each line summarises its own attempts
        rows = [r for r in eval_rows if r["step"] == e["step"]]
        kept = [r["reward"] for r in rows if r["discarded"] is None]
        assert e["eval/attempts"] == len(rows) and e["eval/tasks"] == TASKS
        assert e["eval/reward_mean"] == pytest.approx(sum(kept) / len(kept))
        assert 0.0 <= e["eval/pass_at_1"] <= e["eval/pass_at_2"] <= 1.0
    assert (root / "transcripts" / "eval-000004.json").is_file()
    transcript = json.loads((root / "transcripts" / "eval-000000.json").read_text())
    assert len(transcript) == TASKS * 2 and all(t["trained"] is False for t in transcript)

    # Training never saw a held-out task; eval attempts ran through the same sampler.
    rollouts = read_jsonl(root / "rollouts.jsonl")
    assert {r["task"] for r in rollouts} <= {f"train-{i}" for i in range(TASKS)}
    assert trainer.prompts and all("[train]" in p for p in trainer.prompts)
    assert sampler.calls == len(rollouts) + len(eval_rows)

    # eval/* sits in the record of the step whose rollouts sampled the evaluated policy.
    steps = read_jsonl(root / "steps.jsonl")
    assert [("eval/reward_mean" in s) for s in steps] == [True, False, True, False]
    assert steps[2]["eval/reward_mean"] == evals[1]["eval/reward_mean"]
    assert isinstance(outcome, RLOutcome)
    assert outcome.eval_before is not None and outcome.eval_before["step"] == 0
    assert outcome.eval_after is not None and outcome.eval_after["step"] == 4
    assert outcome.eval_steps == [0, 2, 4]
    assert any(line.startswith("eval: reward_mean") for line in outcome.describe())


async def test_in_async_mode_evaluations_measure_the_published_policy_and_never_train(
    tmp_path: Path, chat: ChatRenderer
) -> None:
    sampler = ScriptedSampler()
    trainer = RecordingTrainer(sampler, chat)
    run = make_run(tmp_path, trainer, chat, training={"mode": "async", "max_staleness": 1})
    await run.execute(0)
    root = tmp_path / "run"
    evals = read_jsonl(root / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert [e["eval/policy_version"] for e in evals] == [0, 2, 4]
    assert all(r["task"].startswith("heldout-") for r in read_jsonl(root / "eval_attempts.jsonl"))
    assert all(r["task"].startswith("train-") for r in read_jsonl(root / "rollouts.jsonl"))


async def test_a_resumed_run_does_not_redo_a_recorded_evaluation(tmp_path: Path, chat: ChatRenderer) -> None:
    sampler = ScriptedSampler()
    # Step 2's evaluation is recorded, then its forward_backward (the 3rd) fails: the checkpoint is at 2.
    run = make_run(tmp_path, RecordingTrainer(sampler, chat, fail_forward_at=3), chat)
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    assert info.value.resume_step == 2
    root = tmp_path / "run"
    assert [e["step"] for e in read_jsonl(root / "evals.jsonl")] == [0, 2]
    before = read_jsonl(root / "evals.jsonl")[1]

    seen = Evals()
    resumed = make_run(tmp_path, RecordingTrainer(sampler, chat), chat, observers=[seen])
    resumed.policy.load_state_with_optimizer = _no_load  # type: ignore[method-assign]
    start = await resumed.resume_point()
    assert start == 2
    await resumed.execute(start)
    evals = read_jsonl(root / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4], "every evaluation once"
    assert evals[1] == before, "step 2's evaluation was kept, not redone"
    assert [line.step for line in seen.lines] == [4], "the resumed run evaluated only the final policy"
    assert len(read_jsonl(root / "eval_attempts.jsonl")) == 3 * TASKS * 2
    steps = read_jsonl(root / "steps.jsonl")
    assert steps[2]["eval/reward_mean"] == before["eval/reward_mean"], "the redone step carries it"


async def test_an_evaluation_past_the_checkpoint_is_dropped_on_resume(
    tmp_path: Path, chat: ChatRenderer
) -> None:
    run = make_run(tmp_path, RecordingTrainer(ScriptedSampler(), chat), chat, every=1)
    await run.execute(0)
    root = tmp_path / "run"
    assert [e["step"] for e in read_jsonl(root / "evals.jsonl")] == [0, 1, 2, 3, 4]
    run.rewind(2)  # what a resume from the checkpoint at step 2 does
    assert [e["step"] for e in read_jsonl(root / "evals.jsonl")] == [0, 1, 2]
    assert {r["step"] for r in read_jsonl(root / "eval_attempts.jsonl")} == {0, 1, 2}
    run.start_over()  # killed before its first checkpoint: only the base model's evaluation still holds
    assert [e["step"] for e in read_jsonl(root / "evals.jsonl")] == [0]


async def test_a_holdout_share_of_the_training_tasks_is_never_trained_on(
    tmp_path: Path, chat: ChatRenderer
) -> None:
    run = make_run(
        tmp_path, RecordingTrainer(ScriptedSampler(), chat), chat, held_out_runtime=False, holdout=0.5
    )
    await run.execute(0)
    root = tmp_path / "run"
    trained = {r["task"] for r in read_jsonl(root / "rollouts.jsonl")}
    evaluated = {r["task"] for r in read_jsonl(root / "eval_attempts.jsonl")}
    assert len(evaluated) == TASKS // 2
    assert not trained & evaluated, "a held-out task was trained on"
    assert trained | evaluated <= {f"train-{i}" for i in range(TASKS)}


async def test_without_eval_nothing_is_evaluated(tmp_path: Path, chat: ChatRenderer) -> None:
    config_run = make_run(
        tmp_path, RecordingTrainer(ScriptedSampler(), chat), chat, held_out_runtime=False, enabled=False
    )
    outcome = await config_run.execute(0)
    assert not (tmp_path / "run" / "evals.jsonl").exists()
    assert isinstance(outcome, RLOutcome) and outcome.eval_after is None
    assert not any("eval/reward_mean" in s for s in read_jsonl(tmp_path / "run" / "steps.jsonl"))


async def _no_load(path: str) -> int:
    return 0


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 4, 1) == 1.0


def test_the_holdout_split_and_the_task_choice_do_not_depend_on_task_order() -> None:
    tasks = [Task(id=f"t{i}") for i in range(20)]
    train, held = split_holdout(tasks, 0.25, seed=0)
    train_reversed, held_reversed = split_holdout(list(reversed(tasks)), 0.25, seed=0)
    assert len(held) == 5 and {t.id for t in held} == {t.id for t in held_reversed}
    assert {t.id for t in train} == {t.id for t in train_reversed}
    assert {t.id for t in split_holdout(tasks, 0.25, seed=1)[1]} != {t.id for t in held}
    with pytest.raises(UserError, match="leaves none to train on"):
        split_holdout(tasks[:1], 0.5, seed=0)
    assert choose_tasks(tasks, 3, seed=0) == choose_tasks(tasks, 3, seed=0)
    assert len(choose_tasks(tasks, 3, seed=0)) == 3 and choose_tasks(tasks, None, seed=0) == tasks


def test_the_eval_section_is_on_when_written_and_its_cadence() -> None:
    written = load(QUICKSTART).config.eval  # the quickstart writes an [eval] table
    assert written.enabled and eval_due(written, 0)
    off = load(QUICKSTART, overrides={"eval.enabled": False}).config.eval
    assert not off.enabled and not eval_due(off, 0)
    on = load(QUICKSTART, overrides={"eval.every": 3}).config.eval
    assert on.enabled
    assert [s for s in range(10) if eval_due(on, s)] == [0, 3, 6, 9]
    no_start = load(QUICKSTART, overrides={"eval.at_start": False}).config.eval
    assert [s for s in range(4) if eval_due(no_start, s)] == []
    with pytest.raises(UserError, match="not both"):
        load(QUICKSTART, overrides={"eval.options": {"answer": "chess"}, "eval.holdout": 0.5})
