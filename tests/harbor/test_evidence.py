"""Harbor trial results as Evidence: rewards, metrics, and every way a trial has no valid reward."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from harbor.models.trial.result import ExceptionInfo

from loops_nb.harbor.evidence import evidence_from_trial

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def timing(seconds: float) -> SimpleNamespace:
    return SimpleNamespace(started_at=T0, finished_at=T0 + timedelta(seconds=seconds))


def result(rewards=None, exception: str | None = None, message: str = "", transcript=None) -> SimpleNamespace:
    info = None
    if exception:
        info = ExceptionInfo(
            exception_type=exception,
            exception_message=message,
            exception_traceback='Traceback (most recent call last):\n  File "agent.py", line 9, in run\nValueError: boom',
            occurred_at=T0,
        )
    verifier = SimpleNamespace(rewards=rewards) if rewards is not None else None
    agent = SimpleNamespace(metadata={"loops_transcript": transcript or []})
    return SimpleNamespace(
        verifier_result=verifier,
        agent_result=agent,
        exception_info=info,
        recorded_exceptions=lambda: [info] if info else [],
        environment_setup=timing(0.5),
        agent_setup=None,
        agent_execution=timing(2.0),
        verifier=timing(0.25),
    )


def test_reward_txt_is_the_reward_and_timings_are_metrics() -> None:
    evidence = evidence_from_trial(result({"reward": 1}), verifier_output="answer: Monopoly\n")
    assert evidence.reward == 1.0 and evidence.discarded is None
    assert evidence.metrics["harbor/agent_execution_seconds"] == 2.0
    assert evidence.metrics["harbor/verifier_seconds"] == 0.25
    assert evidence.transcript[-1] == {"role": "verifier", "content": "answer: Monopoly\n"}


def test_reward_json_entries_besides_the_reward_become_metrics() -> None:
    evidence = evidence_from_trial(result({"reward": 0.5, "file_exists": 1}))
    assert evidence.reward == 0.5
    assert evidence.metrics["harbor/file_exists"] == 1.0


def test_a_single_named_entry_is_the_reward_and_reward_key_picks_among_several() -> None:
    assert evidence_from_trial(result({"passed": 1})).reward == 1.0
    assert evidence_from_trial(result({"passed": 1, "style": 0.2}), reward_key="style").reward == 0.2
    ambiguous = evidence_from_trial(result({"passed": 1, "style": 0.2}))
    assert ambiguous.discarded == "verifier_error" and "reward_key" in ambiguous.detail


@pytest.mark.parametrize(
    ("exception", "reason"),
    [
        ("RewardFileNotFoundError", "no_reward"),
        ("VerifierTimeoutError", "verifier_error"),
        ("VerifierOutputParseError", "verifier_error"),
        ("ContextTooLong", "truncated"),
        ("EnvironmentStartTimeoutError", "timeout"),
        ("TaskNeedsImage", "error"),
        ("ValueError", "error"),
    ],
)
def test_a_trial_without_a_valid_reward_is_discarded_with_its_reason(exception: str, reason: str) -> None:
    evidence = evidence_from_trial(result(None, exception, "what went wrong", transcript=[{"role": "user"}]))
    assert evidence.reward is None
    assert evidence.discarded == reason
    assert f"{exception}: what went wrong" in evidence.detail
    assert evidence.transcript == [{"role": "user"}], "the transcript survives a discard"


def test_an_agent_error_keeps_the_end_of_its_traceback() -> None:
    evidence = evidence_from_trial(result(None, "ValueError", "boom"))
    assert 'File "agent.py", line 9, in run' in evidence.detail
    assert evidence.detail.count("boom") == 1, "the traceback's last line repeats the message: said once"


def test_a_sandbox_refusal_is_said_once_without_a_traceback() -> None:
    message = "task dns: environment/Dockerfile line 9 sets an ENTRYPOINT"
    evidence = evidence_from_trial(result(None, "TaskNeedsImage", message))
    assert evidence.discarded == "error"
    assert evidence.detail == f"TaskNeedsImage: {message}"


def test_an_agent_timeout_is_still_graded_as_harbor_says() -> None:
    evidence = evidence_from_trial(result({"reward": 1}, "AgentTimeoutError", "ran over 2 s"))
    assert evidence.reward == 1.0 and evidence.discarded is None
    assert evidence.metrics["harbor/graded_after_AgentTimeoutError"] == 1.0


def test_no_rewards_at_all_is_no_reward() -> None:
    evidence = evidence_from_trial(result({}))
    assert evidence.discarded == "no_reward"


def test_numbers_an_agent_reports_in_its_metadata_become_metrics() -> None:
    trial = result({"reward": 1})
    trial.agent_result.metadata["shell_agent"] = {
        "turns": 3,
        "tool_calls": 2,
        "stopped": "answer",
        "ok": True,
    }
    evidence = evidence_from_trial(trial)
    assert evidence.metrics["agent/turns"] == 3.0 and evidence.metrics["agent/tool_calls"] == 2.0
    assert "agent/stopped" not in evidence.metrics and "agent/ok" not in evidence.metrics
