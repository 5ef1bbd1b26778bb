"""What of a Harbor task the local sandbox can start, and why it refuses the rest.

Without what it needs, a task's verifier would grade a world missing a piece and a correct solution would
score 0, so each need is refused by name: docs/reference/harbor.md, "The local sandbox (bubblewrap)", lists
them and what `ignore_dockerfile` waives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from harbor.models.trial.paths import EnvironmentPaths

from loops_nb.providers.dockerfile_plan import DockerfilePlan, read_dockerfile

if TYPE_CHECKING:
    from harbor.models.task.config import EnvironmentConfig

DEFAULT_WORKDIR = "/app"
COMPOSE_FILE = "docker-compose.yaml"
"""The file Harbor merges over its own compose config for `main` (harbor.environments.definition)."""
CAN_RUN = "docker, daytona or blaxel"
"""Harbor providers that build images and run compose services, MCP servers and entrypoints."""

_MAIN_KEYS_REPLAYED = {"build", "image", "depends_on", "expose", "healthcheck", "deploy", "cpus", "mem_limit"}
"""docker-compose keys of `main` the local sandbox can do without: resources and ordering, nothing the
task's commands see. Any other (`environment`, `volumes`, `entrypoint`, `command`, `extra_hosts`, ...)
changes the container the verifier runs in, and is refused."""

_PROVIDER_VARIABLES = {
    "DAYTONA_": "daytona",
    "BLAXEL_": "blaxel",
    "BL_": "blaxel",
    "E2B_": "e2b",
    "MODAL_": "modal",
}
"""Environment variable prefixes that tie a task to one provider's own service (e.g. Daytona's Windows
computer-use desktops)."""
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def local_refusal(task: str, plan: DockerfilePlan, docker_image: str | None) -> str | None:
    """Why the local sandbox cannot build a task's image, or None (waived by `ignore_dockerfile`)."""
    if docker_image:
        why = f"it names docker_image = {docker_image!r}"
    elif plan.needs_build:
        why = "environment/Dockerfile needs an image build (" + "; ".join(plan.needs_build[:3]) + ")"
    else:
        return None
    return (
        f"task {task}: the local sandbox builds no images and {why}. Run it on a {CAN_RUN} provider, "
        "or set [providers.local] ignore_dockerfile = true if this machine already has what it installs"
    )


def sandbox_paths(plan: DockerfilePlan, env_config: EnvironmentConfig) -> tuple[str, list[str]]:
    """The task's working directory (task.toml's, else the last WORKDIR, else /app), and every path a local
    sandbox can write: Harbor's, the workdir, each WORKDIR, the task's skills folder (`[environment]
    skills_dir`, which its Dockerfile fills) and /tmp."""
    workdir = env_config.workdir or plan.workdir or DEFAULT_WORKDIR
    paths = EnvironmentPaths.for_os(env_config.os)
    harbor_paths = (
        paths.agent_dir,
        paths.verifier_dir,
        paths.artifacts_dir,
        paths.tests_dir,
        paths.solution_dir,
    )
    skills = [env_config.skills_dir] if env_config.skills_dir else []
    return workdir, [
        *(str(p) for p in harbor_paths),
        "/installed-agent",
        *plan.workdirs,
        workdir,
        *skills,
        "/tmp",
    ]


def static_problems(
    task: str, environment_dir: Path, env_config: EnvironmentConfig, ignore_dockerfile: bool = False
) -> list[str]:
    """Why the local sandbox cannot start a task: `start()` raises the first, `loops check` lists them all.

    `env_config` is the task's Harbor `[environment]` config.
    """
    plan = read_dockerfile(environment_dir / "Dockerfile")
    problems: list[str] = []
    if not ignore_dockerfile:
        refusal = local_refusal(task, plan, env_config.docker_image)
        if refusal:
            problems.append(refusal)
    problems += helper_problems(task, environment_dir, env_config, plan)
    if env_config.gpus:
        problems.append(f"task {task}: it asks for {env_config.gpus} GPU(s); the local sandbox gives none")
    if str(env_config.os.value) == "windows":
        problems.append(f"task {task}: it is a Windows task; the local sandbox runs Linux commands only")
    if str(env_config.network_mode.value) == "allowlist":
        problems.append(
            f'task {task}: network_mode = "allowlist" cannot be enforced by the local sandbox (only all of '
            "the host's network or none); run it on a blaxel or daytona provider"
        )
    problems += _copy_problems(task, environment_dir, env_config, plan)
    return problems


def helper_problems(
    task: str, environment_dir: Path, env_config: EnvironmentConfig, plan: DockerfilePlan
) -> list[str]:
    """What the task needs beside its one container: compose services, MCP servers, a provider's own
    environment, an ENTRYPOINT. Never waived: without them a correct solution scores 0."""
    problems: list[str] = []
    services = _compose_services(environment_dir / COMPOSE_FILE)
    if isinstance(services, str):
        problems.append(f"task {task}: environment/{COMPOSE_FILE}: {services}")
        services = {}
    helpers = sorted(str(name) for name in services if name != "main")
    if helpers:
        problems.append(
            f"task {task}: environment/{COMPOSE_FILE} starts the service(s) {', '.join(helpers)} beside the "
            "agent's container; the local sandbox starts no other containers, so the task would run without "
            f"them and a correct solution would score 0. Run it on a {CAN_RUN} provider"
        )
    main = services.get("main") or {}
    unreplayed = (
        sorted(str(key) for key in main if key not in _MAIN_KEYS_REPLAYED) if isinstance(main, dict) else []
    )
    if unreplayed:
        problems.append(
            f"task {task}: environment/{COMPOSE_FILE} sets {', '.join(unreplayed)} on the main service, which "
            f"the local sandbox does not replay. Run it on a {CAN_RUN} provider"
        )
    remote = [s for s in env_config.mcp_servers if s.transport != "stdio"]
    if remote:
        names = ", ".join(f"{s.name} ({s.url})" for s in remote)
        problems.append(
            f"task {task}: it declares the MCP server(s) {names} in [[environment.mcp_servers]]; they run as "
            f"their own services, which the local sandbox cannot start. Run it on a {CAN_RUN} provider"
        )
    tied = _provider_variables(env_config.env, services)
    for provider, variables in sorted(tied.items()):
        problems.append(
            f"task {task}: its environment needs {provider}'s own variables ({', '.join(sorted(variables))}): "
            f"it runs only on the {provider} provider"
        )
    if plan.entrypoint:
        problems.append(
            f"task {task}: environment/Dockerfile {plan.entrypoint} sets an ENTRYPOINT that runs before the "
            "task's commands (it may start servers or edit system files); the local sandbox cannot run it. "
            f"Run it on a {CAN_RUN} provider"
        )
    return problems


def _compose_services(path: Path) -> dict[str, object] | str:
    """The compose file's services by name (none when there is no file), or why it cannot be read."""
    if not path.is_file():
        return {}
    import yaml  # harbor's own dependency: this module only runs with the harbor extra

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        return f"cannot read it ({' '.join(str(exc).split())[:200]})"
    if data is None:
        return {}
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict):
        return "it is not a compose file with a `services:` mapping"
    return {str(name): service for name, service in services.items()}


def _provider_variables(task_env: Mapping[str, str], services: Mapping[str, object]) -> dict[str, set[str]]:
    """Provider -> the provider-specific variables the task's environment or compose services name."""
    texts = [*task_env, *task_env.values()]
    for service in services.values():
        if isinstance(service, dict):
            env = service.get("environment") or []
            texts += [str(e) for e in (env.items() if isinstance(env, dict) else env)]
    found: dict[str, set[str]] = {}
    for text in texts:
        for name in {m.group(1) for m in _VARIABLE.finditer(text)} | {text.split("=", 1)[0].strip("()' ")}:
            for prefix, provider in _PROVIDER_VARIABLES.items():
                if name.startswith(prefix):
                    found.setdefault(provider, set()).add(name)
    return found


def _copy_problems(
    task: str, environment_dir: Path, env_config: EnvironmentConfig, plan: DockerfilePlan
) -> list[str]:
    _, writable = sandbox_paths(plan, env_config)
    root = environment_dir.resolve()
    problems: list[str] = []
    for source, dest in plan.copies:
        path = (environment_dir / source).resolve()
        if not path.is_relative_to(root):
            problems.append(
                f"task {task}: Dockerfile COPY {source} is outside environment/; a build context cannot reach it either"
            )
        elif not path.exists():
            problems.append(f"task {task}: Dockerfile COPY {source}: environment/{source} does not exist")
        if not any(PurePosixPath(dest).is_relative_to(w) for w in writable):
            problems.append(
                f"task {task}: Dockerfile COPY {source} {dest}: {dest} is outside the local sandbox's writable "
                f"paths ({', '.join(sorted(set(writable)))}), so the copy cannot be replayed; copy into the "
                "WORKDIR instead, or run the task on a docker, blaxel or daytona provider"
            )
    return problems
