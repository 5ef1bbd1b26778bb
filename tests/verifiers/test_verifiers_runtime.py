"""The verifiers runtime on a fake driver: each way an episode ends becomes evidence with its cause.

An episode that raises, hangs, dies, returns NaN or no reward is discarded with the reason (never scored
0, never raised out of the run); one that ran trains its reward and the rubric's metrics.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loops_nb.discard_reason import DiscardReason
from loops_nb.errors import ConfigError, UserError
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.rl.attempt_boundary import checked_evidence
from loops_nb.runtime import Attempt, AttemptServices, CheckWarning, Evidence, ModelAccessMode
from loops_nb.verifiers import VerifiersRuntime


async def attempt_of(
    runtime: VerifiersRuntime, gateway: ModelGateway, llm: Any, task_index: int = 0
) -> tuple[Evidence, Evidence]:
    """One attempt through the gateway: the runtime's evidence, and what the attempt boundary makes of it."""
    task = (await runtime.tasks())[task_index]
    leased = LeasedRuntime(runtime, gateway)
    evidence = await leased.run_attempt(Attempt(task, 0, 0, 1, 0, AttemptServices(llm, llm.capture)))
    checked = checked_evidence(evidence, made_model_calls=bool(llm.capture.calls))
    return evidence, checked


async def test_tasks_and_rubric_come_from_the_driver_list(
    fake_runtime: Callable[..., VerifiersRuntime],
) -> None:
    runtime = fake_runtime({"num_tasks": 4}, limit=2)
    assert runtime.model_access is ModelAccessMode.OPENAI_HTTP
    tasks = await runtime.tasks()
    assert [t.id for t in tasks] == ["task-0", "task-1"]
    assert runtime.prompt_messages(tasks[0]) == [{"role": "user", "content": "Say the word 0."}]
    listing = await runtime.listing()
    assert listing.verifiers_version == "0.4.0"
    assert listing.problems() == []
    lines = "\n".join(listing.lines())
    assert "2 task(s)" in lines and "says_word x1" in lines and "short x0.5" in lines


async def test_an_episode_that_ran_trains_its_reward_and_metrics(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    llm = scripted("the word")
    evidence, checked = await attempt_of(fake_runtime({"mode": "reward"}), gateway, llm)
    assert checked.discarded is None, checked.detail
    assert checked.reward == 1.0
    assert checked.metrics == {"verifiers/says_word": 1.0, "verifiers/short": 0.0, "verifiers/num_calls": 1.0}
    assert len(llm.capture.calls) == 1, "the episode's call went through the attempt's lease"
    assert evidence.transcript[-1] == {"role": "assistant", "content": "the word"}


@pytest.mark.parametrize(
    ("mode", "reason", "says"),
    [
        ("nan", DiscardReason.INVALID_REWARD, "reward nan, not a finite number"),
        ("null", DiscardReason.NO_REWARD, "returned no reward"),
        ("error", DiscardReason.ERROR, "rubric function says_word raised KeyError"),
        ("raise", DiscardReason.ERROR, "the environment's env_response raised"),
        ("die", DiscardReason.ERROR, "was killed by signal 9"),
        ("garbage", DiscardReason.ERROR, "its stdout is not JSON"),
    ],
)
async def test_a_bad_episode_is_discarded_with_its_cause(
    fake_runtime: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    mode: str,
    reason: DiscardReason,
    says: str,
) -> None:
    _, checked = await attempt_of(fake_runtime({"mode": mode}), gateway, scripted("x"))
    assert checked.discarded == reason, checked.detail
    assert says in checked.detail
    assert checked.reward is None, "a bad episode is never scored"


async def test_an_episode_that_hangs_is_killed_at_its_timeout(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = fake_runtime({"mode": "hang"}, episode_timeout_seconds=1.5)
    started = time.monotonic()
    _, checked = await attempt_of(runtime, gateway, scripted("x"))
    assert time.monotonic() - started < 30
    assert checked.discarded == DiscardReason.TIMEOUT
    assert "episode_timeout_seconds (1.5s)" in checked.detail


async def test_a_forked_conversation_trains_each_branch_as_its_own_sequence(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    llm = scripted("first", "second", "branch")
    _, checked = await attempt_of(fake_runtime({"mode": "fork"}), gateway, llm)
    assert checked.discarded is None, checked.detail
    assert len(llm.capture.calls) == 3
    assert llm.capture.breaks_at[1] is None, "the second turn extends the first"
    assert llm.capture.breaks_at[2] is not None, "the branch starts a sequence of its own"


async def test_a_nan_metric_is_left_out_and_the_reward_still_trains(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    _, checked = await attempt_of(fake_runtime({"mode": "nan_metric"}), gateway, scripted("x"))
    assert checked.discarded is None and checked.reward == 1.0
    assert "verifiers/broken" not in checked.metrics


async def test_the_episode_process_gets_its_lease_and_not_the_runs_secrets(
    fake_runtime: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BASETEN_API_KEY", "canary-secret")
    monkeypatch.setenv("JUDGE_KEY", "passed-on")
    dump = tmp_path / "env.json"
    runtime = fake_runtime({"mode": "reward", "env_dump": str(dump)}, pass_env=["JUDGE_KEY"], offline=True)
    _, checked = await attempt_of(runtime, gateway, scripted("x"))
    assert checked.discarded is None, checked.detail
    seen = json.loads(dump.read_text())
    assert "OPENAI_API_KEY" in seen["names"] and "JUDGE_KEY" in seen["names"]
    assert "BASETEN_API_KEY" not in seen["names"]
    assert "HF_DATASETS_OFFLINE" in seen["names"]
    assert seen["argv"][seen["argv"].index("--base-url") + 1] == gateway.url
    assert os.environ["BASETEN_API_KEY"] == "canary-secret"


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("load_fail", "cannot load: environment package 'vf-missing' is not installed"),
        ("hang", "load_timeout_seconds (1.5s)"),
    ],
)
async def test_an_environment_that_cannot_load_refuses_in_one_line(
    fake_runtime: Callable[..., VerifiersRuntime], kind: str, says: str
) -> None:
    runtime = fake_runtime({"list": kind}, load_timeout_seconds=1.5)
    with pytest.raises(UserError, match="fake-env") as raised:
        await runtime.tasks()
    assert says in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(UserError, match="fake-env"):
        await runtime.listing()  # the failure is kept: loading again would take as long to fail again


@pytest.mark.parametrize(
    ("kind", "says"),
    [("old_version", "verifiers 0.3.1 is outside the tested range"), ("no_rubric", "no reward functions")],
)
async def test_check_refuses_an_untested_verifiers_and_a_rubric_without_rewards(
    fake_runtime: Callable[..., VerifiersRuntime], kind: str, says: str
) -> None:
    found = await fake_runtime({"list": kind}).preflight()
    problems = [p for p in found if not isinstance(p, CheckWarning)]
    assert len(problems) == 1 and says in problems[0]


def test_options_are_checked(fake_runtime: Callable[..., VerifiersRuntime]) -> None:
    with pytest.raises(ConfigError, match="env_idd"):
        fake_runtime(env_idd="x")
    with pytest.raises(ConfigError, match="pass_env: BASETEN_API_KEY is one of the run's credentials"):
        fake_runtime(pass_env=["BASETEN_API_KEY"])


async def test_local_packages_cache_dir_and_driver_are_relative_to_the_config(monkeypatch, tmp_path) -> None:
    import loops_nb.verifiers.verifiers_runtime as runtime_module
    from loops_nb.runtime import RunContext
    from loops_nb.verifiers import create_runtime

    built: dict[str, object] = {}

    async def build(requirements, **options):
        built.update(requirements=requirements, **options)
        return None

    monkeypatch.setattr(runtime_module, "verifiers_environment", build)
    runtime = create_runtime(
        env_id="e", packages=["./env", "vf-math==0.1.2"], cache_dir="cache", driver="drive.py"
    )
    runtime.bind(RunContext(config_dir=tmp_path, state_dir=tmp_path / "state"))
    await runtime._build()
    assert built["requirements"] == ["verifiers==0.4.0", str((tmp_path / "env").resolve()), "vf-math==0.1.2"]
    assert built["cache_dir"] == str(tmp_path / "cache")
    assert runtime._driver() == str(tmp_path / "drive.py")
