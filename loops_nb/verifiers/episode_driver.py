"""Run Prime verifiers 0.4 episodes inside the verifiers venv, for the loops_nb verifiers runtime.

This file is copied into (or run by) a separate venv that holds `verifiers==0.4.*` and the environment
packages; it imports nothing from loops_nb. The kit calls it as a subprocess and reads one JSON object
from stdout.

    python episode_driver.py list --env ENV_ID --env-args JSON [--split train|eval] [--limit N]
        -> {"verifiers_version", "env_id", "rubric": {"name", "functions", "weights"},
            "tasks": [{"id", "prompt": [chat messages], "info": {...}}]}

    OPENAI_API_KEY=... python episode_driver.py run --env ENV_ID --env-args JSON --task-id ID \
        --base-url URL --model NAME --sampling JSON
        -> {"reward": float|null, "metrics": {name: float}, "completion": [chat messages],
            "num_calls": int, "error": str|null}

Exit codes: 0 when the command ran (`run`: the episode ran, even when `error` reports a rollout or
scoring problem); 3 on a load-time error (verifiers missing or outside 0.4.x, the environment package
missing, an environment that cannot load offline, a bad argument), with a one-line reason as stderr's
last line; anything else is a crash, its traceback on stderr.

verifiers 0.4 names an environment by its taskset id: the installed module `ENV_ID` (with `-` as `_`)
exporting a `Taskset` subclass (and optionally a `Harness`) in `__all__`. `--env-args` are that
taskset's config fields (`--env.taskset.*` on verifiers' own CLI). `--harness JSON` optionally pins the
agents' harness config (e.g. '{"id": "null"}'); by default the taskset's own harness, else `null` (the
plain chat loop; verifiers itself would pick `bash`, a shell). `--runtime JSON` is where the agents run:
`{"type": "subprocess"}` (this machine) by default, as verifiers' own default is a Prime sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import traceback
from importlib import metadata
from typing import Any

LOAD_ERROR = 3
SUPPORTED = (0, 4)
MAX_SCAN = 100_000
"""Tasks read at most while looking for a task id or listing an unbounded taskset without --limit."""


class LoadError(Exception):
    """A load-time problem the kit reports as is: exit 3, one line on stderr."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:1000]


def _check_version() -> str:
    try:
        version = metadata.version("verifiers")
    except metadata.PackageNotFoundError:
        raise LoadError("verifiers is not installed in this venv (need verifiers==0.4.*)") from None
    parts = version.split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise LoadError(f"cannot read the verifiers version {version!r} (need 0.4.*)") from None
    if major_minor != SUPPORTED:
        raise LoadError(f"verifiers {version} is installed; this driver needs verifiers 0.4.* (verifiers.v1)")
    try:
        import verifiers.v1  # noqa: F401
    except ImportError as e:
        raise LoadError(
            f"verifiers {version} is installed but `verifiers.v1` does not import: {_one_line(e)}"
        ) from e
    return version


def _json_arg(text: str | None, flag: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise LoadError(f"{flag} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise LoadError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value


_OFFLINE_HINTS = (
    "connecterror",
    "connection refused",
    "name or service not known",
    "temporary failure in name",
    "network is unreachable",
    "max retries exceeded",
    "offline",
    "getaddrinfo",
    "could not resolve",
)


def _load_reason(env_id: str, e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, ModuleNotFoundError):
        return f"environment {env_id!r} is not installed in the verifiers venv (install its package there): {_one_line(e)}"
    if any(hint in text.lower() for hint in _OFFLINE_HINTS):
        return (
            f"environment {env_id!r} cannot load offline (it tried to reach the network): {_one_line(text)}"
        )
    return f"environment {env_id!r} failed to load: {_one_line(text)}"


def _load_env(env_id: str, env_args: dict[str, Any], harness: dict[str, Any] | None, runtime: dict[str, Any]):
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import default_harness_id

    data: dict[str, Any] = {"taskset": {**env_args, "id": env_id}}
    try:
        if not harness and default_harness_id(env_id) == "bash":
            # A taskset without a harness of its own gets verifiers' plain chat loop (`null`: the model
            # and the task's MCP tools), not `bash`, which hands the model a shell on this machine.
            harness = {"id": "null"}
        roles = list(agent_config_fields(vf.resolve_env_config(data)))
        # Every seat runs on this machine (verifiers' default runtime is a Prime sandbox reached through a
        # Prime tunnel); `--harness` pins the seats' harness.
        for role in roles:
            data[role] = {"runtime": runtime, **({"harness": harness} if harness else {})}
        config = vf.resolve_env_config(data)
        return vf.load_environment(config)
    except Exception as e:  # noqa: BLE001 - every load failure is reported as a load error
        raise LoadError(_load_reason(env_id, e)) from e


def _task_id(task) -> str:
    data = task.data
    if data.id:
        return str(data.id)
    if data.name:
        return str(data.name)
    return str(data.idx)


def _wire(messages) -> list[dict[str, Any]]:
    from verifiers.v1.dialects.chat import message_to_wire

    return [message_to_wire(message) for message in messages]


def _prompt(task) -> list[dict[str, Any]]:
    data = task.data
    out: list[dict[str, Any]] = []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        out.extend(_wire(data.prompt))
    return out


def _info(task) -> dict[str, Any]:
    import verifiers.v1 as vf

    dumped = task.data.model_dump(mode="json", exclude_none=True)
    info = {key: value for key, value in dumped.items() if key not in vf.TaskData.model_fields}
    info.update({key: dumped[key] for key in ("idx", "name", "description") if key in dumped})
    info["key"] = task.key
    return info


def _tasks(env, limit: int | None):
    taskset = env.taskset
    if limit is not None:
        taskset = taskset.take(limit)
    elif not taskset.bounded:
        taskset = taskset.take(MAX_SCAN)
    try:
        yield from taskset
    except Exception as e:  # noqa: BLE001 - a taskset's load() failing is a load error
        raise LoadError(_load_reason(env.config.taskset.id, e)) from e


def _apply_split(env_args: dict[str, Any], split: str | None, env_id: str) -> dict[str, Any]:
    """verifiers 0.4 tasksets have no split of their own; a taskset with a `split` field takes it."""
    if split is None or "split" in env_args:
        return env_args
    from verifiers.v1.utils.loaders import taskset_config_type

    try:
        fields = taskset_config_type(env_id).model_fields
    except Exception as e:  # noqa: BLE001
        raise LoadError(_load_reason(env_id, e)) from e
    if "split" in fields:
        return {**env_args, "split": split}
    if split != "train":
        print(
            f"note: taskset {env_id!r} has no `split` field; --split {split} lists its only tasks",
            file=sys.stderr,
        )
    return env_args


def cmd_list(args: argparse.Namespace) -> dict[str, Any]:
    version = _check_version()
    env_args = _apply_split(_json_arg(args.env_args, "--env-args"), args.split, args.env)
    env = _load_env(
        args.env, env_args, _json_arg(args.harness, "--harness") or None, _json_arg(args.runtime, "--runtime")
    )
    tasks = []
    first = None
    for task in _tasks(env, args.limit):
        first = first or task
        tasks.append({"id": _task_id(task), "prompt": _prompt(task), "info": _info(task)})
    task_cls = type(env.taskset).task_type()
    if first is not None:
        rewards = first.hooks("reward")
    else:
        rewards = task_cls(task_cls.data_type().model_construct(), env.taskset.config.task).hooks("reward")
    rubric = {
        "name": task_cls.__name__,
        "functions": [fn.__name__ for fn in rewards],
        "weights": [float(getattr(fn, "_vf_weight", 1.0)) for fn in rewards],
    }
    return {"verifiers_version": version, "env_id": args.env, "rubric": rubric, "tasks": tasks}


def _find_task(env, task_id: str):
    for task in _tasks(env, None):
        if _task_id(task) == task_id:
            return task
    raise LoadError(f"environment {env.config.taskset.id!r} lists no task with id {task_id!r}")


def _error_text(errors) -> str | None:
    parts = [f"{error.type}: {_one_line(error.message)}" for error in errors]
    return "; ".join(parts) if parts else None


async def _run_episode(env, task, ctx):
    async with env.serving():
        return await env.run_episode(task, ctx)


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    _check_version()
    import verifiers.v1 as vf

    sampling_args = _json_arg(args.sampling, "--sampling")
    env_args = _apply_split(_json_arg(args.env_args, "--env-args"), args.split, args.env)
    env = _load_env(
        args.env, env_args, _json_arg(args.harness, "--harness") or None, _json_arg(args.runtime, "--runtime")
    )
    task = _find_task(env, args.task_id)
    if not os.environ.get("OPENAI_API_KEY"):
        print("note: OPENAI_API_KEY is unset; calling the model without a key", file=sys.stderr)
    try:
        client = vf.EvalClientConfig(base_url=args.base_url, api_key_var="OPENAI_API_KEY")
        sampling = vf.SamplingConfig(**sampling_args)
    except Exception as e:  # noqa: BLE001 - a bad --base-url/--sampling is the caller's error
        raise LoadError(f"bad --base-url or --sampling: {_one_line(e)}") from e
    ctx = vf.ModelContext(model=args.model, client=client, sampling=sampling)
    episode = asyncio.run(_run_episode(env, task, ctx))
    trace = episode.traces[-1] if episode.traces else None
    errors = list(episode.errors) + (list(trace.errors) if trace is not None else [])
    error = _error_text(errors)
    reward: float | None = None
    metrics: dict[str, float] = {}
    completion: list[dict[str, Any]] = []
    num_calls = 0
    if trace is not None:
        num_calls = len(trace.calls)
        missing = [name for name, value in trace.rewards.items() if value is None]
        if missing:
            error = error or f"reward function(s) {', '.join(missing)} produced no score"
        elif trace.rewards and trace.ok:
            reward = float(trace.reward)
        elif not trace.rewards and error is None:
            error = "the environment recorded no reward"
        for name, value in trace.rewards.items():
            if value is not None:
                metrics[name] = float(value.score)
        for name, value in trace.metrics.items():
            if value is not None:
                metrics[name] = float(value)
        messages = _wire(trace.messages)
        completion = messages[len(_prompt(task)) :]
    elif error is None:
        error = "the episode ran no agent"
    return {
        "reward": reward,
        "metrics": metrics,
        "completion": completion,
        "num_calls": num_calls,
        "error": error,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="episode_driver.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("list", "run"):
        s = sub.add_parser(name)
        s.add_argument("--env", required=True, help="the environment (taskset) id, e.g. loops-hidden-game")
        s.add_argument("--env-args", default="{}", help="JSON object: the taskset's config fields")
        s.add_argument("--harness", default=None, help="JSON object: pin the agent's harness config")
        s.add_argument(
            "--runtime",
            default='{"type": "subprocess"}',
            help="JSON object: where the agents run (default: subprocess, on this machine)",
        )
        s.add_argument("--split", choices=("train", "eval"), default=None)
        if name == "list":
            s.add_argument("--limit", type=int, default=None)
        else:
            s.add_argument("--task-id", required=True)
            s.add_argument("--base-url", required=True)
            s.add_argument("--model", required=True)
            s.add_argument(
                "--sampling", default="{}", help="JSON object: temperature, max_tokens, top_p, ..."
            )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("VF_DRIVER_LOG", "WARNING"),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    real_stdout = sys.stdout
    try:
        # Whatever the environment prints goes to stderr; stdout carries the one JSON object.
        with contextlib.redirect_stdout(sys.stderr):
            result = cmd_list(args) if args.command == "list" else cmd_run(args)
    except LoadError as e:
        if os.environ.get("VF_DRIVER_DEBUG"):
            traceback.print_exc()
        print(_one_line(str(e)), file=sys.stderr)
        return LOAD_ERROR
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
