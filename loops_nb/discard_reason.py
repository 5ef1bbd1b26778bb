"""`DiscardReason`: why an attempt is discarded (kept out of its group and never trained on).

A member is a `str`, and its value is what `rollouts.jsonl` writes as `discarded` and what `steps.jsonl`
counts as `discarded/<reason>` (`eval/discarded/<reason>` in `evals.jsonl`). A runtime may also discard
with a reason of its own (`Evidence.discard("my_reason", ...)`): it is counted as given. Which code discards
for each reason, and when: docs/reference/failures.md#what-is-discarded.
"""

from __future__ import annotations

from enum import StrEnum


class DiscardReason(StrEnum):
    ERROR = "error"
    TIMEOUT = "timeout"
    NO_MODEL_CALLS = "no_model_calls"
    NO_REWARD = "no_reward"
    INVALID_REWARD = "invalid_reward"
    BLOCKED_LOOP = "blocked_loop"
    VERIFIER_ERROR = "verifier_error"
    TRUNCATED = "truncated"
