"""`DiscardReason`: why an attempt is discarded (kept out of its group and never trained on).

A member is a `str`, and its value is what `rollouts.jsonl` writes as `discarded` and what `steps.jsonl`
counts as `discarded/<reason>` (`eval/discarded/<reason>` in `evals.jsonl`). A runtime may also discard
with a reason of its own (`Evidence.discard("my_reason", ...)`): it is counted as given.
"""

from __future__ import annotations

from enum import StrEnum


class DiscardReason(StrEnum):
    ERROR = "error"
    """The attempt raised (its agent or episode, the sampler after the SDK's retries, a sandbox that died), or
    returned something the attempt boundary cannot read (not `Evidence`, metrics that are not numbers, a
    transcript that is not JSON); in a Harbor trial, the agent raised or the environment refused the task."""
    TIMEOUT = "timeout"
    """The attempt ran past `[training] attempt_timeout_seconds`, its only model calls were cut off in
    flight, or Harbor's agent setup or environment start timed out."""
    NO_MODEL_CALLS = "no_model_calls"
    """The attempt returned a reward but never called the model: there is nothing to train."""
    NO_REWARD = "no_reward"
    """The attempt's reward is `None`, or a Harbor verifier wrote no (or an empty) reward file."""
    INVALID_REWARD = "invalid_reward"
    """The reward is not a real number, not finite, or outside `[training] reward_min..reward_max`."""
    BLOCKED_LOOP = "blocked_loop"
    """The attempt blocked the event loop (blocking code in an in-process agent) and so ran past its timeout."""
    VERIFIER_ERROR = "verifier_error"
    """A Harbor verifier timed out, failed for a reason other than the tests, or wrote an unusable reward."""
    TRUNCATED = "truncated"
    """The conversation no longer fits `[model] max_seq_len` (`ContextTooLong`)."""
