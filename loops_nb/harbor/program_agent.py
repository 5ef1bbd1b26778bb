"""`LoopsProgramAgent`: the Harbor local-program pattern. The agent is its own program on this machine.

Each trial launches `command` as every agent program is launched (model_access/agent_program.py: its
attempt's lease, an allowlisted environment, a PID namespace of its own), writes the instruction to its stdin,
and puts what it prints into the sandbox at `output_path`, where the task's verifier looks.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from loops_nb.harbor.agent import LoopsAgent
from loops_nb.model_access import run_agent_program


class LoopsProgramAgent(LoopsAgent):
    """Runs a program per trial; `agent_kwargs`: `command`, `output_path`, `program_timeout`."""

    def __init__(
        self,
        logs_dir: Path,
        *,
        command: str | list[str] = "",
        output_path: str = "/app/answer.txt",
        program_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, **kwargs)
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError('LoopsProgramAgent needs agent_kwargs.command, e.g. ["python", "agent.py"]')
        # `python` means this interpreter, so the program sees the same installed packages.
        self.argv = [sys.executable if argv[0] in ("python", "python3") else argv[0], *argv[1:]]
        self.output_path = output_path
        self.program_timeout = program_timeout

    @staticmethod
    def name() -> str:
        return "loops-program-agent"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if self.attempt is None:
            raise RuntimeError("LoopsProgramAgent runs only inside a loops_nb run")
        # Its lease, never the run's credentials, and no view of other processes' environments.
        done = await run_agent_program(
            self.argv,
            self.attempt,
            input=instruction.encode(),
            cwd=self.config_dir or Path.cwd(),
            timeout=self.program_timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(self.argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-1500:]}"
            )
        out = done.stdout
        answer = out.decode(errors="replace").strip()
        self.transcript += [
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": answer},
        ]
        await self.write_file(environment, self.output_path, answer + "\n")
