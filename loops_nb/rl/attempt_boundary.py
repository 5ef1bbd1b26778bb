"""The attempt boundary: whatever a runtime returns for an attempt becomes `Evidence` that is safe to train on.

An agent, an episode or a verifier is user code, and its result may be anything. `checked_evidence` never
raises: a result it cannot train on becomes a discard with the reason and what to change, so one attempt can
never stop the run. Rewards are bounded (`[training] reward_min..reward_max`) because GRPO only centres them:
their scale is the update's, so a reward of 1e6 is a verifier's bug far more often than a signal.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

from loops_nb.discard_reason import DiscardReason
from loops_nb.runtime import Evidence

REWARD_LIMIT = 1e6
"""The widest `reward_min`/`reward_max` a config may set: GRPO's sums stay far from overflow."""


def checked_evidence(
    result: object,
    *,
    made_model_calls: bool,
    reward_range: tuple[float, float] = (-1.0, 1.0),
    cut_off_calls: int = 0,
) -> Evidence:
    """`result` as Evidence that trains, or a discard that says why it cannot. Never raises.

    `cut_off_calls`: model calls of the attempt that were cut off in flight (`TokenCapture.cut_off`);
    an attempt with no completed call but such a call did call the model: it is a `timeout`, not
    `no_model_calls`.
    """
    try:
        return _checked(result, made_model_calls, reward_range, cut_off_calls)
    except Exception as exc:  # a property or __float__ of user code that raises
        return Evidence.discard(
            DiscardReason.ERROR, f"the attempt's result could not be read: {type(exc).__name__}: {exc}"
        )


def _checked(
    result: object, made_model_calls: bool, reward_range: tuple[float, float], cut_off_calls: int
) -> Evidence:
    if not isinstance(result, Evidence):
        return Evidence.discard(
            DiscardReason.ERROR,
            f"run_attempt returned {type(result).__name__}, not Evidence: return Evidence(reward=...)",
        )
    detail = result.detail if isinstance(result.detail, str) else repr(result.detail)
    transcript, problem = _transcript(result.transcript)
    metrics, metrics_problem = _metrics(result.metrics)
    if result.discarded is not None:
        if not (isinstance(result.discarded, str) and result.discarded):
            return Evidence.discard(
                DiscardReason.ERROR, f"discarded with reason {result.discarded!r}, not a name: {detail}"
            )
        # A discarded attempt records no reward (rollouts.jsonl says `reward: null`), whatever came with it.
        return Evidence(None, metrics, result.discarded, detail, transcript)
    if problem or metrics_problem:
        return Evidence.discard(DiscardReason.ERROR, problem or metrics_problem)
    if not made_model_calls and cut_off_calls:
        return Evidence.discard(
            DiscardReason.TIMEOUT,
            f"the attempt ended with {cut_off_calls} model call(s) cut off in flight (the agent's own "
            "timeout, or a client that gave up before the reply) and none completed: nothing to train",
        )
    if not made_model_calls:
        return Evidence.discard(DiscardReason.NO_MODEL_CALLS, "the attempt never called the model")
    if result.reward is None:
        return Evidence.discard(DiscardReason.NO_REWARD, "the attempt returned no reward (None)")
    reward, problem = _reward(result.reward, reward_range)
    if problem:
        return Evidence(None, metrics, DiscardReason.INVALID_REWARD, problem, transcript)
    return Evidence(reward, metrics, None, detail, transcript)


def _reward(value: object, reward_range: tuple[float, float]) -> tuple[float, str]:
    low, high = reward_range
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (True/False: return 1.0 or 0.0)" if isinstance(value, bool) else ""
        return 0.0, f"reward {value!r} is a {type(value).__name__}, not a number{hint}: return a float"
    try:
        reward = float(value)
    except OverflowError:
        return 0.0, f"reward {value!r} is too large for a float"
    if not math.isfinite(reward):
        return 0.0, f"reward is {reward}, not a finite number"
    if not low <= reward <= high:
        return 0.0, (
            f"reward {reward:g} is outside training.reward_min..reward_max ({low:g}..{high:g}): "
            "scale the reward, or widen the range"
        )
    return reward, ""


def _metrics(metrics: object) -> tuple[dict[str, float], str]:
    if not isinstance(metrics, Mapping):
        return {}, f"metrics is a {type(metrics).__name__}, not a dict of names to numbers"
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not isinstance(value, numbers.Real):
            return {}, f"metric {name!r} = {value!r}: metrics map names to numbers"
        out[name] = float(value)
    return out, ""


def _transcript(transcript: object) -> tuple[list[Any], str]:
    if not isinstance(transcript, list):
        return [], f"transcript is a {type(transcript).__name__}, not a list of messages"
    try:
        # What the run directory will write; a transcript that cannot be written is caught here, not there.
        json.dumps(transcript, default=str)
    except (ValueError, TypeError, RecursionError) as exc:
        return [], f"transcript cannot be written as JSON: {exc}"
    return transcript, ""
