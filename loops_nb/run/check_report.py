"""What `loops check` / `project.check()` found, for any recipe: lines, notes, warnings, problems, a verdict.

Each recipe's report adds its own body (RL: its task count; SFT: the data report and the plan) between the
header lines and the findings; the verdict is the last line and reads the same for every recipe.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from loops_nb.compute import require_api_key
from loops_nb.config.sections import ComputeConfig, ModelConfig
from loops_nb.errors import UserError
from loops_nb.local.memory_budget import check_lines


@dataclass
class RecipeCheckReport:
    """A check's findings. It is ``ok`` unless it found problems; warnings (valid settings that cannot do what
    the user likely wants) do not fail the check, but its last line counts them."""

    lines: list[str] = field(default_factory=list)
    """Header lines: the recipe, scope and model, and what was found in order."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def check_api_key(self, compute: ComputeConfig) -> None:
        """A remote scope without its API key is a problem the report names, not an exception."""
        if compute.scope != "local":
            try:
                require_api_key(compute.scope)
            except UserError as exc:
                self.problems.append(str(exc))

    async def check_memory(
        self, compute: ComputeConfig, model: ModelConfig, concurrent_sequences: int
    ) -> None:
        """A local run's memory estimate (`check_lines`): its lines, and a warning where it may not fit."""
        lines, warnings = await asyncio.to_thread(
            check_lines, compute, model, concurrent_sequences=concurrent_sequences
        )
        self.lines += lines
        self.warnings += warnings

    def body(self) -> list[str]:
        """The recipe's own lines after the header (none by default)."""
        return []

    def describe(self) -> list[str]:
        out = [*self.lines, *self.body()]
        out += [f"note: {n}" for n in self.notes]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"problem: {p}" for p in self.problems]
        if not self.ok:
            out.append(f"check: {len(self.problems)} problem(s)")
        elif self.warnings:
            out.append(f"check: ok with {len(self.warnings)} warning(s)")
        else:
            out.append("check: ok")
        return out
