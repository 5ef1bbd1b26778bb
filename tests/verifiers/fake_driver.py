"""A stand-in for loops_nb/verifiers/episode_driver.py that honours its contract with the stdlib only.

`--env-args` picks the behaviour: {"mode": ...} for `run` (reward, nan, null, error, raise, hang, die,
garbage, fork), {"list": ...} for `list` (ok, load_fail, old_version, no_rubric, hang) and {"serve": ...} for
`serve` (load_fail, load_fail_again: on a second load); {"loads": path} counts loads (`list` and `serve`). A `run` calls the
model once through `--base-url` with the key in OPENAI_API_KEY before it misbehaves, as an episode would;
{"env_dump": path} writes the names of its environment variables there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request


def call_model(
    base_url: str, model: str, prompt: str | list, tools: list | None = None, key: str = ""
) -> dict:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body: dict = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {key or os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
            "X-Session-ID": "fake-session",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def listing(args: argparse.Namespace, env_args: dict) -> int:
    kind = env_args.get("list", "ok")
    if env_args.get("loads"):
        with open(env_args["loads"], "a") as f:
            f.write("load\n")
    if kind == "load_fail":
        print("Traceback (most recent call last):\n  ...", file=sys.stderr)
        print(
            "environment package 'vf-missing' is not installed in the verifiers environment", file=sys.stderr
        )
        return 3
    if kind == "hang":
        time.sleep(3600)
    print("loading environment...")  # a library printing before the result
    print(json.dumps(_listed(args, env_args)))
    return 0


def _listed(args: argparse.Namespace, env_args: dict) -> dict:
    kind = env_args.get("list", "ok")
    tasks = [
        {"id": f"task-{i}", "prompt": [{"role": "user", "content": f"Say the word {i}."}], "info": {"i": i}}
        for i in range(int(env_args.get("num_tasks", 3)))
    ]
    return {
        "verifiers_version": "0.3.1" if kind == "old_version" else "0.4.0",
        "env_id": args.env,
        "rubric": {
            "name": "FakeRubric",
            "functions": [] if kind == "no_rubric" else ["says_word", "short"],
            "weights": [1.0, 0.5],
        },
        "tasks": tasks[: args.limit] if args.limit else tasks,
    }


def run(args: argparse.Namespace, env_args: dict) -> int:
    mode = env_args.get("mode", "reward")
    if env_args.get("env_dump"):
        with open(env_args["env_dump"], "w") as f:
            json.dump({"names": sorted(os.environ), "argv": sys.argv[1:]}, f)
    if mode == "hang":
        time.sleep(3600)
    reply = call_model(args.base_url, args.model, f"Task {args.task_id}", env_args.get("tools"))
    content = reply["choices"][0]["message"]["content"] or ""
    completion = [{"role": "assistant", "content": content}]
    result: dict = {"reward": 1.0, "metrics": {"says_word": 1.0, "short": 0.0}, "completion": completion}
    result.update(num_calls=1, error=None)
    if mode == "fork":  # a second turn, then a branch from the first reply: two sequences
        first = [{"role": "user", "content": f"Task {args.task_id}"}, reply["choices"][0]["message"]]
        for follow_up in ("Go on.", "Try another way."):
            call_model(args.base_url, args.model, [*first, {"role": "user", "content": follow_up}])
        result["num_calls"] = 3
    if mode == "nan":
        result["reward"] = float("nan")
    elif mode == "null":
        result["reward"] = None
    elif mode == "error":
        result["reward"], result["error"] = 0.0, "rubric function says_word raised KeyError: 'answer'"
    elif mode == "raise":
        raise RuntimeError("the environment's env_response raised")
    elif mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "garbage":
        print("not json at all")
        return 0
    elif mode == "nan_metric":
        result["metrics"]["broken"] = float("nan")
    print(json.dumps(result))
    return 0


def serve(args: argparse.Namespace, env_args: dict) -> int:
    """`serve`: episodes on threads, one result line each; `{"cancel": id}` answers `cancelled` at once,
    unless the mode is `block` (the whole process stops, as an environment that blocks its loop)."""
    import threading

    again = False
    if env_args.get("loads"):
        with open(env_args["loads"], "a") as f:
            f.write("load\n")
        with open(env_args["loads"]) as f:
            again = f.read().count("load") > 1
    if env_args.get("serve") == "load_fail" or (env_args.get("serve") == "load_fail_again" and again):
        print("environment 'fake-env' cannot load offline (it tried to reach the network)", file=sys.stderr)
        return 3
    lock = threading.Lock()

    def emit(obj: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    def one(request: dict) -> None:
        mode = env_args.get("mode", "reward")
        if mode == "hang":
            time.sleep(3600)
        if mode == "block":
            time.sleep(3600)
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        reply = call_model(
            request["base_url"], request["model"], f"Task {request['task_id']}", key=request["api_key"]
        )
        content = reply["choices"][0]["message"]["content"] or ""
        emit(
            {
                "id": request["id"],
                "reward": 1.0,
                "metrics": {"says_word": 1.0},
                "completion": [{"role": "assistant", "content": content}],
                "num_calls": 1,
                "error": None,
            }
        )

    emit({"ready": True, **_listed(args, env_args)})
    for line in sys.stdin:
        request = json.loads(line)
        if "cancel" in request:
            if env_args.get("mode") == "block":
                time.sleep(3600)
            emit(
                {
                    "id": request["cancel"],
                    "reward": None,
                    "metrics": {},
                    "completion": [],
                    "num_calls": 0,
                    "error": "cancelled",
                }
            )
            continue
        threading.Thread(target=one, args=(request,), daemon=True).start()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["list", "run", "serve"])
    parser.add_argument("--env", required=True)
    parser.add_argument("--env-args", default="{}")
    parser.add_argument("--split", default="train")
    parser.add_argument("--harness")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--task-id")
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    parser.add_argument("--sampling", default="{}")
    args = parser.parse_args()
    env_args = json.loads(args.env_args)
    if args.command == "serve":
        return serve(args, env_args)
    return listing(args, env_args) if args.command == "list" else run(args, env_args)


if __name__ == "__main__":
    sys.exit(main())
