"""What `loops check` / `project.check()` found, for any recipe: lines, notes, warnings, problems, a verdict.

Each recipe's report adds its own body (RL: its task count; SFT: the data report and the plan) between the
header lines and the findings; the verdict is the last line and reads the same for every recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecipeCheckReport:
    """A check's findings. ``ok`` is False only for problems; warnings (valid settings that cannot do what the
    user likely wants) do not fail the check, but its last line counts them."""

    ok: bool = True
    lines: list[str] = field(default_factory=list)
    """Header lines: the recipe, scope and model, and what was found in order."""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    preflight_dir: str | None = None
    """The preflight run directory the check wrote (`check.json`), where the recipe writes one."""

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
