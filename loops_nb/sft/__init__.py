"""Supervised fine-tuning: data contracts, the target rule, check and training (docs/reference/sft.md).

The names below are importable from `loops_nb.sft`; each is loaded from its module on first use, so importing
one part of the recipe (`loops_nb.sft.targets`, say) does not import the rest. (`compare` is the module's
name, so the function is imported from `loops_nb.sft.compare`.)
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BatchPlan": "batching",
    "ExampleIndex": "batching",
    "SFTData": "batching",
    "is_held_out": "batching",
    "Comparison": "compare",
    "score_reply": "compare",
    "ChatRow": "data",
    "Message": "data",
    "RefusedRow": "data",
    "TokenizedRow": "data",
    "iter_rows": "data",
    "parse_row": "data",
    "read_rows": "data",
    "SFTCheckReport": "recipe",
    "Example": "targets",
    "RenderedRow": "targets",
    "SFTTargets": "targets",
    "chat_targets": "targets",
    "sft_targets": "targets",
    "CheckReport": "report",
    "learning_rate": "schedule",
    "SFTOutcome": "outcome",
    "SFTRun": "loop",
}
"""Public name -> the module of `loops_nb.sft` that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'loops_nb.sft' has no attribute {name!r}")
    return getattr(importlib.import_module(f"loops_nb.sft.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
