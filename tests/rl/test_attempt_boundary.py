"""The attempt boundary: whatever an attempt returns or raises is discarded with a reason or trained on,
never a crash of the run; rewards outside the cap are discarded before GRPO's arithmetic."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from loops_nb.discard_reason import DiscardReason
from loops_nb.episodes import Episode, EpisodeRuntime
from loops_nb.llm.capture import ModelCall
from loops_nb.llm.client import llm
from loops_nb.rl.attempt_boundary import checked_evidence
from loops_nb.rl.grpo import group_advantages
from loops_nb.rl.scheduler import RolloutScheduler
from loops_nb.runtime import Attempt, Evidence, Task


class Returns:
    """A runtime whose attempt at task `i` records a model call and returns `results[i]` (or raises it)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results

    async def tasks(self) -> list[Task]:
        return [Task(str(i)) for i in range(len(self.results))]

    async def run_attempt(self, attempt: Attempt) -> Any:
        attempt.services.capture.record(ModelCall([1, 2], [3], [-0.5], 0, "stop"))
        result = self.results[int(attempt.task.id)]
        if isinstance(result, BaseException):
            raise result
        return result

    async def close(self) -> None:
        pass


async def outcomes(results: list[Any], **kw: Any) -> list[Evidence]:
    runtime = Returns(results)
    scheduler = RolloutScheduler(
        runtime,
        await runtime.tasks(),
        make_llm=lambda capture, seed: None,
        version=lambda: 0,
        group_size=1,
        groups_per_step=1,
        max_concurrent=4,
        attempt_timeout=30,
        seed=0,
        **kw,
    )
    try:
        return [(await scheduler.run_group(0, 0, task)).attempts[0].evidence for task in scheduler.tasks]
    finally:
        await scheduler.close()


class Circular(list):
    pass


def circular() -> list[Any]:
    loop = Circular()
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("result", "reason", "detail"),
    [
        (Evidence(reward="0.5"), "invalid_reward", "is a str, not a number"),  # type: ignore[arg-type]
        (Evidence(reward=True), "invalid_reward", "return 1.0 or 0.0"),
        (Evidence(reward=-5.0), "invalid_reward", "outside training.reward_min..reward_max (-1..1)"),
        (Evidence(reward=1e308), "invalid_reward", "outside"),
        (Evidence(reward=10**400), "invalid_reward", "too large for a float"),
        (Evidence(reward=math.nan), "invalid_reward", "not a finite number"),
        (Evidence(reward=None), "no_reward", "no reward"),
        ("0.5", "error", "returned str, not Evidence"),
        (Evidence(reward=0.5, metrics={"n": "two"}), "error", "metric 'n'"),  # type: ignore[dict-item]
        (Evidence(reward=0.5, transcript=circular()), "error", "cannot be written as JSON"),
        (Evidence(reward=math.nan, discarded="verifier_error", detail="bad"), "verifier_error", "bad"),
        (Evidence(reward=0.5, discarded=3), "error", "reason 3, not a name"),  # type: ignore[arg-type]
        (SystemExit(3), "error", "sys.exit(3)"),
        (KeyError("x"), "error", "KeyError"),
    ],
)
async def test_what_cannot_train_is_discarded_with_its_reason(result: Any, reason: str, detail: str) -> None:
    (evidence,) = await outcomes([result])
    assert evidence.discarded == reason
    assert detail in evidence.detail
    assert evidence.reward is None, "a discarded attempt records no reward, whatever came with it"


async def test_real_numbers_in_range_train_as_floats() -> None:
    results = [
        Evidence(reward=1),
        Evidence(reward=np.float32(0.25)),
        Evidence(reward=-1.0),
        Evidence(reward=0),
    ]
    evidence = await outcomes(results)
    assert [e.discarded for e in evidence] == [None] * 4
    assert [e.reward for e in evidence] == [1.0, 0.25, -1.0, 0.0]
    assert all(type(e.reward) is float for e in evidence)
    (wide,) = await outcomes([Evidence(reward=-5.0)], reward_range=(-10.0, 10.0))
    assert wide.reward == -5.0 and wide.discarded is None


class RecordingLLM:
    """The model handle an Episode gets from `llm()`: records one call, as the real one does."""

    def __init__(self, capture: Any) -> None:
        self.capture = capture

    async def chat(self, messages: list[dict[str, str]]) -> None:
        self.capture.record(ModelCall([1, 2], [3], [-0.5], 0, "stop"))


class Says(Episode):
    """Calls the model, then returns `value` from run."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def tasks(self) -> list[str]:
        return ["t"]

    async def run(self, task: Task) -> Any:
        await llm().chat([{"role": "user", "content": "hi"}])
        return self.value


@pytest.mark.parametrize(
    ("value", "reason"), [(True, "invalid_reward"), ("0.5", "invalid_reward"), (None, "no_reward"), (1, None)]
)
async def test_an_episode_returning_a_bool_or_a_string_is_not_converted(
    value: Any, reason: str | None
) -> None:
    runtime = EpisodeRuntime(Says(value))
    scheduler = RolloutScheduler(
        runtime,
        await runtime.tasks(),
        make_llm=lambda capture, seed: RecordingLLM(capture),  # type: ignore[arg-type,return-value]
        version=lambda: 0,
        group_size=1,
        groups_per_step=1,
        max_concurrent=1,
        attempt_timeout=30,
        seed=0,
    )
    (group,) = await scheduler.collect_sync(0)
    await scheduler.close()
    assert group.attempts[0].evidence.discarded == reason


def test_reading_the_evidence_never_raises() -> None:
    class Exploding(Evidence):
        @property  # type: ignore[override]
        def reward(self) -> float:
            raise RuntimeError("verifier state is gone")

        @reward.setter
        def reward(self, value: float) -> None:
            pass

    evidence = checked_evidence(Exploding(reward=1.0), made_model_calls=True)
    assert evidence.discarded == "error" and "verifier state is gone" in evidence.detail


def test_grpo_advantages_of_ordinary_rewards_are_the_plain_formulas() -> None:
    rewards = [0.0, 1.0, 0.1, 0.3, 1.0]
    mean = math.fsum(rewards) / len(rewards)
    adv = group_advantages(rewards)
    assert adv.advantages == [r - mean for r in rewards] and adv.mean == mean
    assert adv.std == math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))


def test_a_model_call_cut_off_in_flight_is_a_timeout_and_completed_calls_still_train() -> None:
    cut = checked_evidence(Evidence(reward=1.0), made_model_calls=False, cut_off_calls=1)
    assert cut.discarded == "timeout" and "cut off in flight" in cut.detail
    assert checked_evidence(Evidence(reward=1.0), made_model_calls=False).discarded == "no_model_calls"
    kept = checked_evidence(Evidence(reward=1.0), made_model_calls=True, cut_off_calls=1)
    assert kept.discarded is None and kept.reward == 1.0


def test_discard_reasons_are_written_as_their_plain_names() -> None:
    """rollouts.jsonl and steps.jsonl keep the names they always had: an enum member is written as its value."""
    names = {"error", "timeout", "no_model_calls", "no_reward", "invalid_reward", "blocked_loop"}
    assert {str(r) for r in DiscardReason} == names | {"verifier_error", "truncated"}
    assert json.dumps({"discarded": DiscardReason.BLOCKED_LOOP}) == '{"discarded": "blocked_loop"}'
    assert f"discarded/{DiscardReason.NO_REWARD}" == "discarded/no_reward"
