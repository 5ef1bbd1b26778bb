"""An episode's outcome as `Evidence`: its reward and rubric metrics, or a discard that names the cause.

Whatever the environment does, one attempt never stops the run and never scores a made-up 0: each outcome
and its discard reason is in docs/reference/verifiers.md, "Rewards and discards".
"""

from __future__ import annotations

import math
import signal
from typing import Any

from loops_nb.discard_reason import DiscardReason
from loops_nb.runtime import Evidence
from loops_nb.verifiers.driver_process import LOAD_FAILED, DriverOutcome, finite

METRIC_PREFIX = "verifiers/"


def evidence_from_episode(
    outcome: DriverOutcome, timeout: float, prompt: list[Any] | None = None
) -> Evidence:
    """The attempt's evidence from its driver `run` (`timeout`: the limit it ran under, for the detail)."""
    if outcome.timed_out:
        return Evidence.discard(
            DiscardReason.TIMEOUT,
            f"the verifiers episode ran past runtime.options.episode_timeout_seconds ({timeout:g}s) and was "
            "killed (an environment, tool or rubric that hangs)",
        )
    if outcome.returncode == LOAD_FAILED:
        return Evidence.discard(
            DiscardReason.ERROR,
            f"the verifiers environment could not load: {outcome.reason() or outcome.tail()}",
        )
    if outcome.returncode != 0:
        how = _how_it_ended(outcome.returncode)
        return Evidence.discard(
            DiscardReason.ERROR, f"the verifiers process {how}: {outcome.tail() or '(no stderr)'}"
        )
    result = outcome.result
    if result is None:
        return Evidence.discard(
            DiscardReason.ERROR, f"the verifiers episode gave no result: {outcome.unreadable}"
        )
    transcript = _transcript(prompt, result.get("completion"))
    metrics = _metrics(result.get("metrics"))
    calls = finite(result.get("num_calls"))
    if calls is not None:
        metrics[f"{METRIC_PREFIX}num_calls"] = calls
    error = result.get("error")
    if error:
        return _discard(
            DiscardReason.ERROR,
            f"the verifiers episode recorded an error: {str(error)[:1500]}",
            metrics,
            transcript,
        )
    reward = result.get("reward")
    if reward is None:
        return _discard(
            DiscardReason.NO_REWARD, "the environment's rubric returned no reward (null)", metrics, transcript
        )
    value = finite(reward)
    if value is None:
        shown = reward if isinstance(reward, float) and math.isnan(reward) else repr(reward)
        return _discard(
            DiscardReason.INVALID_REWARD,
            f"the environment's rubric returned reward {shown}, not a finite number",
            metrics,
            transcript,
        )
    return Evidence(reward=value, metrics=metrics, transcript=transcript)


def _how_it_ended(returncode: int | None) -> str:
    """An exit code in words; bubblewrap's init reports a program killed by signal N as exit 128 + N."""
    code = returncode if returncode is not None else 0
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    if number:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {number} ({name}; exit code {returncode})"
    return f"exited {returncode}"


def _discard(
    reason: DiscardReason, detail: str, metrics: dict[str, float], transcript: list[Any]
) -> Evidence:
    return Evidence(reward=None, metrics=metrics, discarded=reason, detail=detail, transcript=transcript)


def _metrics(raw: object) -> dict[str, float]:
    """The rubric's metrics that are finite numbers, as `verifiers/<name>` (a NaN metric is left out)."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, value in raw.items():
        number = finite(value)
        if isinstance(name, str) and number is not None:
            out[f"{METRIC_PREFIX}{name}"] = number
    return out


def _transcript(prompt: list[Any] | None, completion: object) -> list[Any]:
    """The task's prompt and the episode's completion, as chat messages (what is not a message is left out)."""
    messages = list(prompt or [])
    if isinstance(completion, list):
        messages += [m for m in completion if isinstance(m, dict)]
    elif isinstance(completion, str) and completion:
        messages.append({"role": "assistant", "content": completion})
    return messages
