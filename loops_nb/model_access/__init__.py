"""Model access for agents that are their own programs: per-attempt leases and an OpenAI-compatible gateway.

An in-process agent calls `llm()`; an agent in another process (a CLI, a framework, any language)
talks OpenAI's Chat Completions or Responses API to the run's `ModelGateway`, with the attempt's lease key as
its API key. Both paths end in the same `LoopsLLM`, so rendering, sampling and exact token capture are
one code path.
"""

from loops_nb.model_access.agent_env import agent_process_env, model_env
from loops_nb.model_access.agent_program import (
    AgentProgramResult,
    run_agent_program,
    start_agent_program,
    stop_agent_program,
)
from loops_nb.model_access.gateway import ModelGateway
from loops_nb.model_access.leased_runtime import LeasedRuntime
from loops_nb.model_access.leases import AttemptLease, LeaseRegistry
from loops_nb.model_access.mode import FILES_PER_ATTEMPT, ModelAccessMode, model_access_of, open_file_problem

__all__ = [
    "FILES_PER_ATTEMPT",
    "AgentProgramResult",
    "AttemptLease",
    "LeaseRegistry",
    "LeasedRuntime",
    "ModelAccessMode",
    "ModelGateway",
    "agent_process_env",
    "model_access_of",
    "model_env",
    "open_file_problem",
    "run_agent_program",
    "start_agent_program",
    "stop_agent_program",
]
