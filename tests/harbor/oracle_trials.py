"""Harbor's reference solution (its `oracle` agent) run in the local sandbox, as a user's `harbor run` would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial


async def run_oracle(task: Path, tmp_path: Path, *, ignore_dockerfile: bool = True) -> Any:
    """The `TrialResult` of one oracle trial of `task` on `loops_nb.providers.local:LocalSandboxEnvironment`."""
    trial = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name="oracle"),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"scratch_dir": str(tmp_path / "scratch"), "ignore_dockerfile": ignore_dockerfile},
        ),
    )
    return await (await Trial.create(trial)).run()
