"""What the episode driver's `list` says of an environment: verifiers' version, the rubric and the tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loops_nb.errors import UserError
from loops_nb.runtime import Task
from loops_nb.verifiers.options import DEFAULT_VERIFIERS, TESTED_VERSIONS


@dataclass(frozen=True)
class Rubric:
    """The environment's rubric: its name, its reward functions and their weights."""

    name: str = ""
    functions: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def describe(self) -> str:
        if not self.functions:
            return f"{self.name or 'rubric'} with no reward functions"
        weights = [*self.weights, *[1.0] * (len(self.functions) - len(self.weights))]
        weighted = [f"{fn} x{w:g}" for fn, w in zip(self.functions, weights, strict=False)]
        return f"{self.name or 'rubric'}: {', '.join(weighted)}"


@dataclass(frozen=True)
class EnvironmentListing:
    verifiers_version: str
    env_id: str
    rubric: Rubric
    tasks: list[Task]

    @classmethod
    def parse(cls, raw: dict[str, Any], name: str) -> EnvironmentListing:
        """The driver's JSON, checked; a UserError (one line) says what is wrong with it."""
        tasks_raw = raw.get("tasks")
        if not isinstance(tasks_raw, list):
            raise UserError(f"{name}: the episode driver's list has no `tasks` list")
        tasks: list[Task] = []
        seen: set[str] = set()
        for i, entry in enumerate(tasks_raw):
            if not isinstance(entry, dict) or entry.get("id") in (None, ""):
                raise UserError(f"{name}: task {i} of the list has no id")
            task_id = str(entry["id"])
            if task_id in seen:
                raise UserError(f"{name}: two tasks have the id {task_id!r}; task ids must be unique")
            seen.add(task_id)
            prompt = entry.get("prompt")
            info = entry.get("info")
            tasks.append(
                Task(
                    id=task_id,
                    data={
                        "prompt": prompt if isinstance(prompt, list) else [],
                        "info": info if isinstance(info, dict) else {},
                    },
                )
            )
        if not tasks:
            raise UserError(f"{name}: the environment lists no tasks (check env_args, split and limit)")
        rubric_raw = raw.get("rubric") if isinstance(raw.get("rubric"), dict) else {}
        assert isinstance(rubric_raw, dict)
        functions = [str(f) for f in rubric_raw.get("functions") or []]
        weights = [float(w) for w in rubric_raw.get("weights") or [] if isinstance(w, int | float)]
        rubric = Rubric(str(rubric_raw.get("name") or ""), functions, weights)
        return cls(str(raw.get("verifiers_version") or ""), str(raw.get("env_id") or ""), rubric, tasks)

    def tested(self) -> bool:
        return self.verifiers_version.startswith(TESTED_VERSIONS)

    def warnings(self) -> list[str]:
        """What `loops check` warns of: rubric weights that can add up past the default reward range."""
        top = sum(w for w in self.rubric.weights if w > 0)
        if top > 1.0:
            return [
                f"the rubric's positive weights add up to {top:g}: an episode that earns them all gets a reward "
                f"above 1, which [training] reward_max must allow (default 1), or it is discarded as "
                "invalid_reward"
            ]
        return []

    def problems(self) -> list[str]:
        """What `loops check` refuses: an untested verifiers, a rubric that can give no reward."""
        found = []
        if not self.tested():
            found.append(
                f"verifiers {self.verifiers_version or '(unknown version)'} is outside the tested range "
                f"({', '.join(v + 'x' for v in TESTED_VERSIONS)}): set runtime.options.verifiers = "
                f'"{DEFAULT_VERIFIERS}"'
            )
        if not self.rubric.functions:
            found.append(
                f"verifiers environment {self.env_id!r}: its rubric has no reward functions, so no attempt "
                "could get a reward"
            )
        return found

    def lines(self) -> list[str]:
        """What `loops check` prints of the environment."""
        first = self.tasks[0].data.get("prompt") or []
        text = ""
        if first and isinstance(first[-1], dict):
            content = first[-1].get("content")
            text = content if isinstance(content, str) else "(multimodal content)"
        return [
            f"verifiers {self.verifiers_version}, environment {self.env_id}: {len(self.tasks)} task(s) "
            f"({', '.join(t.id for t in self.tasks[:5])}{', ...' if len(self.tasks) > 5 else ''})",
            f"rubric {self.rubric.describe()}",
            f"first task's prompt: {' '.join(text.split())[:200]!r}",
        ]
