"""`loops check` on the local scope: will a task's agent have time for the model calls it makes?

Harbor tasks set their agent's timeout for a GPU-served model (60-120 s); on a CPU one call can take half
a minute, and an attempt cut off after one or two calls trains on nothing. This check multiplies a call's
estimated time here (`loops_nb.local.call_time`) by the calls the agent is expected to make, and names the
setting to raise when the task's limit is shorter.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from loops_nb.errors import UserError
from loops_nb.llm.renderer import Renderer
from loops_nb.rl.config import RLConfig
from loops_nb.runtime import AgentTimeLimit, CheckWarning, RolloutRuntime

if TYPE_CHECKING:
    from loops_nb.local.call_time import LocalCallSpeed


async def agent_time_warnings(
    config: RLConfig, runtime: RolloutRuntime, renderer: Renderer
) -> list[CheckWarning]:
    """One warning per task whose agent cannot make its expected calls in time here (local scope only)."""
    compute = config.compute
    if compute.scope != "local" or compute.base_url or os.environ.get("LOOPS_BASE_URL"):
        return []  # a joined `loops serve` or Baseten: this machine's speed says nothing
    limits = await runtime.agent_time_limits()
    if not limits:
        return []
    from loops_nb.local.call_time import LocalCallSpeed
    from loops_nb.local.model_store import resolve_model

    try:
        model_dir = resolve_model(config.model.base_model, cache_dir=compute.local.cache_dir).path
        speed = await asyncio.to_thread(
            LocalCallSpeed.measure, model_dir, concurrent=config.training.max_concurrent_rollouts
        )
    except (UserError, OSError, ValueError, KeyError):  # the model itself is checked (and reported) elsewhere
        return []
    return [w for limit in limits if (w := _warning(limit, config, renderer, speed)) is not None]


def _warning(
    limit: AgentTimeLimit, config: RLConfig, renderer: Renderer, speed: LocalCallSpeed
) -> CheckWarning | None:
    new_tokens = config.sampling.max_tokens
    first = len(renderer.prompt_tokens([{"role": "user", "content": limit.first_prompt}]))
    # Each turn's prompt holds the earlier replies: on average half of them (tool output left out: errs short).
    prompt = first + (limit.calls - 1) * new_tokens // 2
    call = speed.call(prompt, new_tokens)
    needed = limit.calls * call.seconds
    bounds: Sequence[tuple[float, str]] = [
        (limit.seconds, limit.set_by),
        (config.training.attempt_timeout_seconds, "[training] attempt_timeout_seconds"),
    ]
    seconds, set_by = min(bounds)
    if needed <= seconds:
        return None
    fits = max(0, int(seconds // call.seconds)) if call.seconds > 0 else limit.calls
    suggested = math.ceil(2 * needed / 60.0) * 60
    fix = (
        f"set [runtime.options] agent_timeout_seconds = {suggested}"
        if set_by == limit.set_by
        else f"set [training] attempt_timeout_seconds = {suggested}"
    )
    return CheckWarning(
        f"task {limit.task}: the agent has {seconds:g} s ({set_by}), and a model call here takes {call.describe()}, "
        f"so {limit.calls} call(s) ({limit.calls_set_by}) need about {needed:.0f} s: attempts will be cut off "
        f"after about {fits} call(s). {fix[0].upper() + fix[1:]} (twice the estimate), or lower max_tokens"
    )
