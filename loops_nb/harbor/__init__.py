"""Harbor as one runtime among others: `create_runtime`, and `LoopsAgent` for the agent you write.

`[runtime] factory = "loops_nb.harbor:create_runtime"` runs each attempt as a Harbor trial; the agent
(a `LoopsAgent` subclass) calls the model through loops_nb, and the task's verifier gives the reward.
Needs the `harbor` extra (plus `harbor-blaxel` / `harbor-daytona` for those sandboxes).
docs/reference/harbor.md has the whole contract.
"""

from __future__ import annotations

from typing import Any

from loops_nb.harbor.harbor_runtime import HarborRuntime, create_runtime

_AGENTS = {
    "LoopsAgent": "loops_nb.harbor.agent",
    "LoopsProgramAgent": "loops_nb.harbor.program_agent",
    "LoopsTerminus2": "loops_nb.harbor.terminus_agent",
    "ShellAgent": "loops_nb.harbor.shell_agent",
}
__all__ = ["HarborRuntime", "create_runtime", *_AGENTS]


def __getattr__(name: str) -> Any:
    # The agent classes subclass Harbor's BaseAgent: import Harbor only when they are asked for.
    if name in _AGENTS:
        import importlib

        return getattr(importlib.import_module(_AGENTS[name]), name)
    raise AttributeError(name)
