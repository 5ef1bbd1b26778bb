"""Harbor task directories with hostile files: links out of the task, COPY out of environment/, missing
files. Each is refused with a message naming the task and the file; nothing reaches a sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from loops_nb.errors import ConfigError
from loops_nb.harbor.harbor_runtime import HarborRuntime

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"


def task_copy(tmp_path: Path, name: str = "task") -> Path:
    task = tmp_path / "tasks" / name
    shutil.copytree(HIDDEN_GAME, task)
    return task


async def tasks_of(source: Path) -> list:
    return list(await HarborRuntime(agent="x:Y", tasks=str(source)).tasks())


@pytest.mark.parametrize("where", ["tests/test.sh", "environment/secret", "solution/notes/link"])
async def test_a_file_linking_outside_the_task_is_refused(tmp_path: Path, where: str) -> None:
    task = task_copy(tmp_path)
    outside = tmp_path / "host_secret"
    outside.write_text("BASETEN_API_KEY=...")
    link = task / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        link.unlink()
    link.symlink_to(outside)
    with pytest.raises(ConfigError, match=f"{where} links outside the task"):
        await tasks_of(tmp_path / "tasks")


async def test_links_inside_the_task_are_fine(tmp_path: Path) -> None:
    task = task_copy(tmp_path)
    (task / "solution" / "again.sh").symlink_to(task / "solution" / "solve.sh")
    assert [t.id for t in await tasks_of(tmp_path / "tasks")] == ["task"]


async def test_missing_task_files_are_named(tmp_path: Path) -> None:
    task = task_copy(tmp_path)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(ConfigError, match="tests/test.sh"):
        await tasks_of(tmp_path / "tasks")


@pytest.mark.bwrap
async def test_a_dockerfile_copy_out_of_environment_is_refused(tmp_path: Path) -> None:
    task = task_copy(tmp_path)
    (tmp_path / "host_secret").write_text("secret")
    (task / "environment" / "Dockerfile").write_text(
        "FROM debian\nWORKDIR /app\nCOPY ../../../host_secret /app/\n"
    )
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name="oracle"),
        environment=EnvironmentConfig(
            import_path="loops_nb.providers.local:LocalSandboxEnvironment",
            kwargs={"scratch_dir": str(tmp_path / "scratch"), "keep_sandboxes": True},
        ),
    )
    result = await (await Trial.create(config)).run()
    assert result.exception_info.exception_type == "TaskNeedsImage"
    assert "is outside environment/" in result.exception_info.exception_message
    assert not list((tmp_path / "scratch").rglob("host_secret"))
