"""A Harbor `TrialResult` as loops_nb `Evidence`: Harbor's reward files become the episode reward.

The reward is the `reward_key` entry of the verifier's rewards (the only entry when there is one); the others
become metrics `harbor/<name>`. A trial without a valid reward, or whose agent raised (Harbor would grade
it; loops_nb never trains on an agent's crash), is a discarded attempt with its reason, never a crash of the
run. docs/reference/harbor.md, "Rewards and discards", maps each Harbor error to its reason.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from loops_nb.discard_reason import DiscardReason
from loops_nb.runtime import Evidence

if TYPE_CHECKING:
    from harbor.models.trial.result import ExceptionInfo, TimingInfo, TrialResult

# Harbor exception type -> loops_nb discard reason (anything else is `error`).
DISCARD_REASONS: dict[str, DiscardReason] = {
    "ContextTooLong": DiscardReason.TRUNCATED,
    "AgentTimeoutError": DiscardReason.TIMEOUT,  # only when Harbor's policy is overridden not to grade it
    "AgentSetupTimeoutError": DiscardReason.TIMEOUT,
    "EnvironmentStartTimeoutError": DiscardReason.TIMEOUT,
    "VerifierTimeoutError": DiscardReason.VERIFIER_ERROR,
    "VerifierCannotRun": DiscardReason.VERIFIER_ERROR,  # the local sandbox: a verifier that broke, not failed tests
    "VerifierOutputParseError": DiscardReason.VERIFIER_ERROR,
    "DownloadVerifierDirError": DiscardReason.VERIFIER_ERROR,
    "AddTestsDirError": DiscardReason.VERIFIER_ERROR,
    "RewardFileNotFoundError": DiscardReason.NO_REWARD,
    "RewardFileEmptyError": DiscardReason.NO_REWARD,
}


REFUSED_BY_THE_SANDBOX = {"TaskNeedsImage"}
"""The local sandbox refused the task before the agent ran: its message says why, a traceback says nothing."""


def _where(traceback: str, message: str) -> str:
    """The traceback's last frames, without its final `module.Type: message` line (the detail's first line
    says that already, and a detail says each thing once)."""
    text = traceback.strip()
    said = message.strip().splitlines()[0] if message.strip() else ""
    at = text.rfind(said) if said else -1
    if at >= 0:
        text = text[: text.rfind("\n", 0, at) + 1]
    return "\n".join(text.strip().splitlines()[-6:])


def _seconds(timing: TimingInfo | None) -> float | None:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return None
    return (timing.finished_at - timing.started_at).total_seconds()


def trial_metrics(result: TrialResult) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name in ("environment_setup", "agent_setup", "agent_execution", "verifier"):
        seconds = _seconds(getattr(result, name, None))
        if seconds is not None:
            metrics[f"harbor/{name}_seconds"] = seconds
    return metrics


def _graded(exc: ExceptionInfo) -> bool:
    """Whether a trial that recorded `exc` may still train on its reward.

    Harbor grades an exception type it does not know (it treats it as the agent's business); loops_nb
    does not: an agent that raised is discarded as `error`, as it is in every runtime, so a bug in agent
    code never trains the model towards reward 0. Types Harbor knows keep Harbor's policy (an agent
    timeout is graded), except the ones loops_nb maps to a discard reason.
    """
    from harbor.models.trial.error_policy import ERROR_POLICIES

    if exc.exception_type in DISCARD_REASONS and exc.exception_type != "AgentTimeoutError":
        return False
    if exc.exception_type not in ERROR_POLICIES:
        return False
    return bool(exc.policy.has_valid_reward)


def agent_metrics(result: TrialResult) -> dict[str, float]:
    """Numbers an agent reported in Harbor's result metadata (e.g. ShellAgent's turns and tool calls)."""
    metadata = (result.agent_result and result.agent_result.metadata) or {}
    out: dict[str, float] = {}
    for group, values in metadata.items():
        if group == "loops_transcript" or not isinstance(values, dict):
            continue
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                out[f"agent/{name}"] = float(value)
    return out


def evidence_from_trial(
    result: TrialResult, reward_key: str = "reward", verifier_output: str = ""
) -> Evidence:
    """Evidence of one finished trial (a harbor `TrialResult`)."""
    metrics = trial_metrics(result)
    transcript = list(
        ((result.agent_result and result.agent_result.metadata) or {}).get("loops_transcript") or []
    )
    if verifier_output:
        transcript.append({"role": "verifier", "content": verifier_output[-4000:]})

    def discard(reason: DiscardReason, detail: str) -> Evidence:
        return Evidence(reward=None, discarded=reason, detail=detail, metrics=metrics, transcript=transcript)

    rewards = dict((result.verifier_result and result.verifier_result.rewards) or {})
    problems = [e for e in result.recorded_exceptions() if not _graded(e)]
    if problems:
        first = problems[0]
        reason = DISCARD_REASONS.get(first.exception_type, DiscardReason.ERROR)
        detail = f"{first.exception_type}: {first.exception_message}".strip()
        if reason == DiscardReason.ERROR and first.exception_type not in REFUSED_BY_THE_SANDBOX:
            # The user's agent raised: the last lines of the traceback say where.
            detail += "\n" + _where(first.exception_traceback, first.exception_message)
        return discard(reason, detail)
    if not rewards:
        return discard(
            DiscardReason.NO_REWARD, "the verifier wrote no /logs/verifier/reward.txt or reward.json"
        )
    if reward_key not in rewards and len(rewards) != 1:
        return discard(
            DiscardReason.VERIFIER_ERROR,
            f"reward.json has {sorted(rewards)} but no {reward_key!r}: name one entry {reward_key!r}, "
            "or set [runtime.options] reward_key",
        )
    reward = float(rewards.pop(reward_key if reward_key in rewards else next(iter(rewards))))
    if not math.isfinite(reward):
        return Evidence.discard(DiscardReason.VERIFIER_ERROR, f"the verifier's reward is {reward}", **metrics)
    metrics.update({f"harbor/{name}": float(value) for name, value in rewards.items()})
    metrics.update(agent_metrics(result))
    for exc in result.recorded_exceptions():  # graded anyway (an agent timeout): keep, but say so
        metrics[f"harbor/graded_after_{exc.exception_type}"] = 1.0
    return Evidence(reward=reward, metrics=metrics, transcript=transcript)
