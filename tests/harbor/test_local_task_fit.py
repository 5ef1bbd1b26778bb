"""Tasks in the shapes of the public harbor-cookbook recipes that the local sandbox cannot start whole.

Each used to pass `loops check` under `ignore_dockerfile = true` and then run without a piece: multi-container's
API service, mcp-tools' MCP server, the computer-use desktops (Daytona's own variables), dns-blacklisting's
ENTRYPOINT that edits /etc/hosts and starts a server. A correct solution then scored 0. Each is now refused
by name, at `check` and again at `start()`, with the providers that can run it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from harbor.models.task.task import Task as HarborTask
from helpers import run_cli_in_process
from oracle_trials import run_oracle
from test_local_check import config

from loops_nb.providers.dockerfile_plan import read_dockerfile
from loops_nb.providers.local_task_fit import static_problems

REPO = Path(__file__).resolve().parents[2]
HIDDEN_GAME = REPO / "patterns" / "harbor" / "tasks" / "hidden_game"

COMPOSE_HELPER = """\
services:
  main:
    depends_on:
      api-server:
        condition: service_healthy
  api-server:
    build:
      context: ./api-server
    expose:
      - "5000"
"""

MCP_SERVER = """
[[environment.mcp_servers]]
name = "mcp-server"
transport = "streamable-http"
url = "http://mcp-server:8000/mcp"
"""

DAYTONA_ENV = """
[environment.env]
DAYTONA_API_KEY = "${DAYTONA_API_KEY}"
DAYTONA_API_URL = "${DAYTONA_API_URL:-https://win.trydaytona.com/api}"
"""

BUILDS = "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y curl python3\nWORKDIR /app\n"


def task(tmp_path: Path, name: str, *, toml: str = "", compose: str = "", dockerfile: str = BUILDS) -> Path:
    """hidden_game reshaped: `toml` appended to task.toml, `compose` as environment/docker-compose.yaml."""
    path = tmp_path / "tasks" / name
    shutil.copytree(HIDDEN_GAME, path)
    (path / "task.toml").write_text((path / "task.toml").read_text() + toml)
    (path / "environment" / "Dockerfile").write_text(dockerfile)
    if compose:
        (path / "environment" / "docker-compose.yaml").write_text(compose)
    return path


def problems(path: Path, ignore_dockerfile: bool = True) -> list[str]:
    env = HarborTask(path).config.environment
    return static_problems(path.name, path / "environment", env, ignore_dockerfile)


def test_a_compose_helper_service_is_refused_even_with_ignore_dockerfile(tmp_path: Path) -> None:
    found = problems(task(tmp_path, "multi_container", compose=COMPOSE_HELPER))
    assert len(found) == 1, found
    assert "starts the service(s) api-server beside the agent's container" in found[0]
    assert "a correct solution would score 0" in found[0] and "docker, daytona or blaxel" in found[0]


def test_a_compose_file_with_only_main_resources_is_fine(tmp_path: Path) -> None:
    compose = "services:\n  main:\n    cpus: 1\n    healthcheck:\n      test: ['CMD', 'true']\n"
    assert problems(task(tmp_path, "plain", compose=compose)) == []
    extra_hosts = "services:\n  main:\n    extra_hosts:\n      - 'api:127.0.0.1'\n"
    found = problems(task(tmp_path, "hosts", compose=extra_hosts))
    assert len(found) == 1 and "sets extra_hosts on the main service" in found[0], found


def test_a_broken_compose_file_is_named(tmp_path: Path) -> None:
    found = problems(task(tmp_path, "broken", compose="services: [unclosed\n"))
    assert len(found) == 1 and "environment/docker-compose.yaml: cannot read it" in found[0], found


def test_an_mcp_server_is_refused(tmp_path: Path) -> None:
    found = problems(
        task(tmp_path, "mcp_tools", toml=MCP_SERVER, compose=COMPOSE_HELPER.replace("api", "mcp"))
    )
    mcp = [p for p in found if "MCP server" in p]
    assert len(found) == 2 and len(mcp) == 1, found
    assert "mcp-server (http://mcp-server:8000/mcp) in [[environment.mcp_servers]]" in mcp[0]


def test_a_stdio_mcp_server_runs_in_the_agents_sandbox_and_is_not_refused(tmp_path: Path) -> None:
    stdio = '\n[[environment.mcp_servers]]\nname = "files"\ntransport = "stdio"\ncommand = "python3"\n'
    assert problems(task(tmp_path, "stdio", toml=stdio)) == []


def test_daytona_variables_tie_a_task_to_daytona(tmp_path: Path) -> None:
    found = problems(task(tmp_path, "computer_use_windows", toml=DAYTONA_ENV))
    assert found == [
        "task computer_use_windows: its environment needs daytona's own variables (DAYTONA_API_KEY, "
        "DAYTONA_API_URL): it runs only on the daytona provider"
    ]
    compose = "services:\n  desktop:\n    environment:\n      - DAYTONA_API_KEY\n"
    found = problems(task(tmp_path, "computer_use_ubuntu", compose=compose))
    assert len(found) == 2 and any("only on the daytona provider" in p for p in found), found


ENTRYPOINT = """\
FROM ubuntu:24.04
RUN apt-get update && apt-get install -y curl python3
COPY entrypoint.sh /app/entrypoint.sh
ENTRYPOINT ["/app/entrypoint.sh"]
WORKDIR /app
"""


def test_an_entrypoint_is_refused_and_a_shell_or_init_one_is_not(tmp_path: Path) -> None:
    path = task(tmp_path, "dns_blacklisting", dockerfile=ENTRYPOINT)
    (path / "environment" / "entrypoint.sh").write_text("#!/bin/bash\necho '127.0.0.1 ads' >> /etc/hosts\n")
    found = problems(path)
    assert len(found) == 1, found
    assert 'line 4: ENTRYPOINT ["/app/entrypoint.sh"] sets an ENTRYPOINT' in found[0]
    for harmless in ('["/bin/bash", "-c"]', '["tini", "--"]', "[]", "/usr/bin/dumb-init --"):
        dockerfile = tmp_path / f"Dockerfile{len(harmless)}"
        dockerfile.write_text(f"FROM debian\nENTRYPOINT {harmless}\n")
        assert read_dockerfile(dockerfile).entrypoint is None, harmless
    staged = tmp_path / "Dockerfile.staged"
    staged.write_text('FROM a AS build\nENTRYPOINT ["/x"]\nFROM debian\nWORKDIR /app\n')
    assert read_dockerfile(staged).entrypoint is None  # the last stage does not inherit an earlier one's


@pytest.mark.bwrap
def test_check_lists_every_refusal_with_ignore_dockerfile(tmp_path: Path, tiny_chat_model_path: Path) -> None:
    task(tmp_path, "multi_container", compose=COMPOSE_HELPER)
    task(tmp_path, "computer_use_windows", toml=DAYTONA_ENV)
    path = config(tmp_path, tiny_chat_model_path, tmp_path / "tasks", ignore_dockerfile=True)
    result = run_cli_in_process("check", path)
    assert result.returncode == 1, result.stdout
    refused = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert len(refused) == 2, result.stdout
    assert any("task multi_container:" in line and "api-server" in line for line in refused)
    assert any("task computer_use_windows:" in line and "daytona" in line for line in refused)


@pytest.mark.bwrap
async def test_start_refuses_it_too_so_no_trial_runs_without_its_helper(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = task(tmp_path, "multi_container", compose=COMPOSE_HELPER)
    result = await run_oracle(path, tmp_path)
    assert result.exception_info is not None
    assert result.exception_info.exception_type == "TaskNeedsImage"
    assert "starts the service(s) api-server" in result.exception_info.exception_message
    assert result.verifier_result is None
    # Harbor still asks a sandbox that never started for the agent's logs: no traceback per attempt for that.
    noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noisy, noisy


def test_a_skills_folder_its_dockerfile_fills_is_writable(tmp_path: Path) -> None:
    """harbor-cookbook's skills recipe COPYs skills/ into `[environment] skills_dir`: replayable, not refused."""
    path = task(tmp_path, "skills", dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nCOPY skills/ /skills/\n")
    toml = path / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", '[environment]\nskills_dir = "/skills"\n'))
    (path / "environment" / "skills" / "greet").mkdir(parents=True)
    (path / "environment" / "skills" / "greet" / "SKILL.md").write_text("# greet\n")
    assert problems(path, ignore_dockerfile=False) == []
