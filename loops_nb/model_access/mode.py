"""How a runtime's agents reach the model: in-process (`llm()`) or over OpenAI-compatible HTTP.

A runtime (or the Episode an `EpisodeRuntime` wraps) declares `model_access = ModelAccessMode.OPENAI_HTTP`
when its agent is a separate program; the recipe then starts a `ModelGateway` and issues each attempt a
lease. The mode also sizes the open-file check: a process per attempt holds far more descriptors.
"""

from __future__ import annotations

import resource

from loops_nb.runtime import ModelAccessMode, RolloutRuntime

FILES_PER_ATTEMPT = {
    ModelAccessMode.IN_PROCESS: 4,
    # A child process's stdin/stdout/stderr pipes (both ends while it starts), its pidfd, and the
    # gateway's client and server sockets for a couple of keep-alive connections, plus spare.
    ModelAccessMode.OPENAI_HTTP: 16,
}
"""Open files one live attempt may hold under each mode (the open-file check's unit)."""


def model_access_of(runtime: object) -> ModelAccessMode:
    """The mode a runtime asks for: its `model_access`, or its Episode's; in-process by default."""
    if isinstance(runtime, RolloutRuntime):
        return ModelAccessMode(runtime.model_access)
    for holder in (runtime, getattr(runtime, "episode", None)):
        value = getattr(holder, "model_access", None)
        if value is not None:
            return ModelAccessMode(value)
    return ModelAccessMode.IN_PROCESS


FILES_BASELINE = 256
"""Open files the process needs besides attempts (torch, the servers, logs)."""


def open_file_problem(max_concurrent: int, mode: ModelAccessMode) -> str | None:
    """A message when the open-file limit is too low for the configured concurrency."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FILES_BASELINE + max_concurrent * FILES_PER_ATTEMPT[mode]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise_to = need if hard == resource.RLIM_INFINITY else min(need, hard)
        return (
            f"open-file limit {soft} is too low for training.max_concurrent_rollouts = {max_concurrent} "
            f"(needs about {need}): run `ulimit -n {raise_to}` in this shell first"
            + (
                ""
                if hard == resource.RLIM_INFINITY or hard >= need
                else f", or lower the concurrency (hard limit {hard})"
            )
        )
    return None
