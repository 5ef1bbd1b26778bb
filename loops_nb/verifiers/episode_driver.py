"""Run Prime verifiers 0.4 episodes inside the verifiers venv, for the loops_nb verifiers runtime.

This file is copied into (or run by) a separate venv that holds `verifiers==0.4.*` and the environment
packages; it imports nothing from loops_nb. The kit runs it as a subprocess: `list`, `run` and `serve`,
their JSON, exit codes and options are in docs/reference/verifiers.md, "The episode driver".
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
POOL_KEY_VAR = "LOOPS_VF_NO_KEY"
"""The pooled client's key variable (unset): a request is sent by a copy that holds its own key."""
SUPPORTED = (0, 4)
POOL_WRITTEN_FOR = "0.4.0"
"""The verifiers whose private `InterceptionServer._client` `serve` replaces (the kit's pinned version)."""
MAX_SCAN = 100_000
"""Tasks read at most while looking for a task id or listing an unbounded taskset without --limit."""


class LoadError(Exception):
    """A load-time problem the kit reports as is: exit 3, one line on stderr."""


def _one_line(text: object) -> str:
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
    except Exception as e:
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
    except Exception as e:
        raise LoadError(_load_reason(env.config.taskset.id, e)) from e


def _apply_split(env_args: dict[str, Any], split: str | None, env_id: str) -> dict[str, Any]:
    """verifiers 0.4 tasksets have no split of their own; a taskset with a `split` field takes it."""
    if split is None or "split" in env_args:
        return env_args
    from verifiers.v1.utils.loaders import taskset_config_type

    try:
        fields = taskset_config_type(env_id).model_fields
    except Exception as e:
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
    env = _env_from_args(args)
    return _listing(env, list(_tasks(env, args.limit)), version)


def _listing(env, tasks: list, version: str) -> dict[str, object]:
    """`list`'s object: the verifiers version, the rubric (from the first task's reward hooks) and the tasks."""
    task_cls = type(env.taskset).task_type()
    if tasks:
        rewards = tasks[0].hooks("reward")
    else:
        rewards = task_cls(task_cls.data_type().model_construct(), env.taskset.config.task).hooks("reward")
    rubric = {
        "name": task_cls.__name__,
        "functions": [fn.__name__ for fn in rewards],
        "weights": [float(getattr(fn, "_vf_weight", 1.0)) for fn in rewards],
    }
    listed = [{"id": _task_id(task), "prompt": _prompt(task), "info": _info(task)} for task in tasks]
    return {"verifiers_version": version, "env_id": env.config.taskset.id, "rubric": rubric, "tasks": listed}


def _find_task(env, task_id: str, limit: int | None):
    for task in _tasks(env, limit):
        if _task_id(task) == task_id:
            return task
    raise LoadError(f"environment {env.config.taskset.id!r} lists no task with id {task_id!r}")


def _error_text(errors) -> str | None:
    parts = [f"{error.type}: {_one_line(error.message)}" for error in errors]
    return "; ".join(parts) if parts else None


async def _run_episode(env, task, ctx):
    async with env.serving():
        return await env.run_episode(task, ctx)


def _client_context(vf, base_url: str, model: str, sampling_args: dict[str, Any], api_key_var: str):
    try:
        client = vf.EvalClientConfig(base_url=base_url, api_key_var=api_key_var)
        sampling = vf.SamplingConfig(**sampling_args)
    except Exception as e:
        raise LoadError(f"bad --base-url or --sampling: {_one_line(e)}") from e
    return vf.ModelContext(model=model, client=client, sampling=sampling)


def _result(episode, task) -> dict[str, Any]:
    """The contract's `run` object from a finished episode."""
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


def _failed(request_id: str, error: str) -> dict[str, object]:
    """`serve`'s result line for an episode that gave no result."""
    return {"id": request_id, "reward": None, "metrics": {}, "completion": [], "num_calls": 0, "error": error}


def _share_one_pool(version: str) -> None:
    """Every episode's model client on one connection pool, each still with its own lease key. verifiers'
    interception server builds a client (an httpx pool and TLS context: ~20-40 ms of CPU) per distinct client
    config and keeps its sockets until the process ends: per attempt here, as each key has its own variable.
    This replaces a private method, `InterceptionServer._client(config)`, as verifiers `POOL_WRITTEN_FOR` has
    it; a verifiers without it is a load error, not a pool per episode again."""
    import copy
    import inspect

    import verifiers.v1 as vf
    from verifiers.v1.configs.client import resolve_api_key, resolve_headers
    from verifiers.v1.interception.server import InterceptionServer

    pooled = getattr(InterceptionServer, "_client", None)
    if not callable(pooled) or list(inspect.signature(pooled).parameters) != ["self", "config"]:
        raise LoadError(
            f"verifiers {version} has no `InterceptionServer._client(self, config)`, which the shared episode "
            f'process (episodes = "shared") replaces to keep one connection pool; it is written against '
            f"verifiers {POOL_WRITTEN_FOR}, the kit's pinned version: pin verifiers=={POOL_WRITTEN_FOR} or use "
            f'episodes = "per_attempt"'
        )

    def client(self, config):
        if type(config) is not vf.EvalClientConfig:
            return pooled(self, config)
        endpoint = vf.EvalClientConfig(
            base_url=config.base_url, api_key_var=POOL_KEY_VAR, timeout=config.timeout
        )
        lease = copy.copy(pooled(self, endpoint))  # shares the pool; only the pooled one is closed
        lease.api_key, lease.headers = resolve_api_key(config), resolve_headers(config)
        return lease

    InterceptionServer._client = client


def _env_from_args(args: argparse.Namespace):
    env_args = _apply_split(_json_arg(args.env_args, "--env-args"), args.split, args.env)
    return _load_env(
        args.env, env_args, _json_arg(args.harness, "--harness") or None, _json_arg(args.runtime, "--runtime")
    )


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    _check_version()
    import verifiers.v1 as vf

    sampling_args = _json_arg(args.sampling, "--sampling")
    env = _env_from_args(args)
    task = _find_task(env, args.task_id, args.limit)
    if not os.environ.get("OPENAI_API_KEY"):
        print("note: OPENAI_API_KEY is unset; calling the model without a key", file=sys.stderr)
    ctx = _client_context(vf, args.base_url, args.model, sampling_args, "OPENAI_API_KEY")
    episode = asyncio.run(_run_episode(env, task, ctx))
    return _result(episode, task)


def cmd_serve(args: argparse.Namespace, out) -> None:
    """Many episodes in one process (verifiers imported and the environment loaded once).

    stdout: first `{"ready": true}` with `list`'s object (no `list` process needed), then one line per
    finished episode: the `run` object plus its request's `id` (and `"crashed": true`, the traceback on stderr, for an
    episode that raised). stdin: one JSON object a line, `{"id", "task_id", "base_url", "model",
    "sampling", "api_key"}` to start an episode, `{"cancel": id}` to cancel one (it answers with
    `"error": "cancelled"`). Episodes run concurrently, at most --max-concurrent at once; at the end of stdin
    the ones in flight finish, then the process exits 0.
    """
    version = _check_version()
    import verifiers.v1 as vf

    _share_one_pool(version)
    env = _env_from_args(args)
    listed = list(_tasks(env, args.limit))
    tasks = {_task_id(task): task for task in listed}

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[str | None] = asyncio.Queue()

        def read_stdin() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)

        import threading

        threading.Thread(target=read_stdin, daemon=True).start()
        gate = asyncio.Semaphore(args.max_concurrent)
        running: dict[str, asyncio.Task] = {}
        counter = 0

        async def one(request_id: str, request: dict[str, Any]) -> None:
            nonlocal counter
            counter += 1
            # Each request's key in a variable of its own: verifiers reads the key from a named variable.
            key_var = f"LOOPS_VF_KEY_{counter}"
            try:
                async with gate:
                    task = tasks.get(str(request.get("task_id")))
                    if task is None:
                        emit(_failed(request_id, f"no task with id {request.get('task_id')!r}"))
                        return
                    os.environ[key_var] = str(request.get("api_key") or "")
                    model, sampling = (
                        str(request.get("model") or "policy"),
                        dict(request.get("sampling") or {}),
                    )
                    ctx = _client_context(vf, str(request["base_url"]), model, sampling, key_var)
                    episode = await env.run_episode(task, ctx)
                    emit({"id": request_id, **_result(episode, task)})
            except asyncio.CancelledError:
                emit(_failed(request_id, "cancelled"))
            except Exception as e:
                traceback.print_exc()
                emit({**_failed(request_id, f"crash: {type(e).__name__}: {_one_line(e)}"), "crashed": True})
            finally:
                os.environ.pop(key_var, None)
                running.pop(request_id, None)

        async with env.serving():
            emit({"ready": True, **_listing(env, listed, version)})
            while (line := await lines.get()) is not None:
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ValueError("not a JSON object")
                except ValueError as e:
                    print(f"serve: ignored a line that is not a JSON object: {e}", file=sys.stderr)
                    continue
                if "cancel" in request:
                    if (job := running.get(str(request["cancel"]))) is not None:
                        job.cancel()
                    continue
                request_id = str(request.get("id", ""))
                running[request_id] = asyncio.create_task(one(request_id, request))
            if running:
                await asyncio.gather(*running.values(), return_exceptions=True)

    asyncio.run(serve())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="episode_driver.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("list", "run", "serve"):
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
        s.add_argument("--limit", type=int, default=None, help="the first N tasks only")
        if name == "serve":
            s.add_argument("--max-concurrent", type=int, default=64, help="episodes at once, at most")
        elif name == "run":
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
            if args.command == "serve":
                cmd_serve(args, real_stdout)
                return 0
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
