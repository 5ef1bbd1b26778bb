"""The episode driver (`loops_nb/verifiers/episode_driver.py`) in a real verifiers 0.4 venv, against a fake
OpenAI-compatible server: `list` and `run` print the contract's JSON, a tool call round-trips, load errors
exit 3 with a one-line reason.

The venv: `$VF_DRIVER_VENV` when set (a venv with verifiers==0.4.* and
patterns/verifiers/hidden_game/env installed), else one built here with uv (needs PyPI or uv's cache);
skipped, with the reason, where neither works. The version check runs without verifiers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fake_chat_server import FakeChatServer

from loops_nb.verifiers.options import DEFAULT_VERIFIERS

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "loops_nb" / "verifiers" / "episode_driver.py"
HIDDEN_GAME_ENV = REPO / "patterns" / "verifiers" / "hidden_game" / "env"
ENV = "loops-hidden-game"
TASK = "hidden-monopoly-0"


def _driver_module():
    spec = importlib.util.spec_from_file_location("episode_driver_under_test", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- no verifiers needed -------------------------------------------------------------------------------


def test_the_driver_imports_nothing_but_the_standard_library_at_module_level() -> None:
    source = DRIVER.read_text()
    imports = [line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not [name for name in imports if name.split(".")[0] in ("loops_nb", "verifiers")], imports
    module = _driver_module()  # the kit's venv has no verifiers: importing it must not need one
    assert module.LOAD_ERROR == 3


@pytest.mark.parametrize(
    ("installed", "refusal"),
    [(None, "not installed"), ("0.1.10", "0.1.10 is installed"), ("0.5.0", "0.5.0 is installed")],
)
def test_verifiers_outside_0_4_is_a_load_error(monkeypatch, installed, refusal) -> None:
    module = _driver_module()

    def version(name: str) -> str:
        if installed is None:
            raise module.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(module.metadata, "version", version)
    with pytest.raises(module.LoadError, match=refusal):
        module._check_version()


def test_bad_json_arguments_are_load_errors() -> None:
    module = _driver_module()
    with pytest.raises(module.LoadError, match="--env-args is not JSON"):
        module._json_arg("{nope", "--env-args")
    with pytest.raises(module.LoadError, match="must be a JSON object"):
        module._json_arg("[1]", "--sampling")


def _stub_verifiers(monkeypatch, interception_server: type) -> None:
    """Just enough of a `verifiers.v1` for `_share_one_pool` to import, its server `interception_server`."""
    names = ("verifiers", "verifiers.v1", "verifiers.v1.configs", "verifiers.v1.configs.client")
    names += ("verifiers.v1.interception", "verifiers.v1.interception.server")
    for name in names:
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    for parent, child in (name.rsplit(".", 1) for name in names[1:]):
        setattr(sys.modules[parent], child, sys.modules[f"{parent}.{child}"])
    for name in ("resolve_api_key", "resolve_headers"):
        setattr(sys.modules["verifiers.v1.configs.client"], name, lambda config: None)
    sys.modules["verifiers.v1.interception.server"].InterceptionServer = interception_server


@pytest.mark.parametrize("changed", ["gone", "renamed parameter"])
def test_a_verifiers_that_changed_the_private_client_method_refuses_shared_episodes(
    monkeypatch, changed
) -> None:
    """Issue 44: `serve`'s one connection pool replaces verifiers' private `InterceptionServer._client`; a
    verifiers that changed it is a load error naming the pinned version, not a silent pool per episode."""
    module = _driver_module()

    class InterceptionServer:
        if changed == "renamed parameter":

            def _client(self, client_config):
                return client_config

    _stub_verifiers(monkeypatch, InterceptionServer)
    with pytest.raises(module.LoadError) as refused:
        module._share_one_pool("0.4.9")
    message = str(refused.value)
    assert "verifiers 0.4.9 has no `InterceptionServer._client(self, config)`" in message
    assert f"pin verifiers=={module.POOL_WRITTEN_FOR}" in message and "per_attempt" in message


def test_the_pool_is_written_against_the_pinned_verifiers() -> None:
    assert f"verifiers=={_driver_module().POOL_WRITTEN_FOR}" == DEFAULT_VERIFIERS, (
        "the default verifiers pin moved: check that verifiers still has `InterceptionServer._client(self, "
        "config)` as episode_driver._share_one_pool replaces it, then move POOL_WRITTEN_FOR with the pin"
    )


# -- in the verifiers venv -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def vf_python(tmp_path_factory) -> Path:
    given = os.environ.get("VF_DRIVER_VENV")
    if given:
        python = Path(given) / "bin" / "python"
        if not python.exists():
            pytest.skip(f"VF_DRIVER_VENV={given} has no bin/python")
        return python
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed: cannot build the verifiers venv")
    venv = tmp_path_factory.mktemp("vf") / "venv"
    steps = [
        [uv, "venv", str(venv), "--python", f"{sys.version_info.major}.{sys.version_info.minor}", "-q"],
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            "verifiers==0.4.0",
            str(HIDDEN_GAME_ENV),
        ],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(
                f"cannot build the verifiers venv ({' '.join(step[:3])}): {done.stderr.strip()[-300:]}"
            )
    return venv / "bin" / "python"


def _drive(
    python: Path, *args: str, key: str | None = "sk-lease-test", timeout: float = 300
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run(
        [str(python), str(DRIVER), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _json(done: subprocess.CompletedProcess) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # one JSON object, nothing else on stdout
    return json.loads(lines[0])


def _run(python: Path, server: FakeChatServer, env_args: dict[str, Any], **extra: str) -> dict[str, Any]:
    sampling = extra.pop("sampling", json.dumps({"temperature": 0.7, "max_tokens": 16}))
    return _json(
        _drive(
            python,
            "run",
            "--env",
            ENV,
            "--env-args",
            json.dumps(env_args),
            "--task-id",
            TASK,
            "--base-url",
            server.base_url,
            "--model",
            "policy-m",
            "--sampling",
            sampling,
        )
    )


@pytest.mark.slow
def test_list_prints_the_tasks_and_the_rubric(vf_python) -> None:
    out = _json(_drive(vf_python, "list", "--env", ENV, "--env-args", '{"num_tasks": 3}', "--limit", "2"))
    assert out["verifiers_version"].startswith("0.4.")
    assert out["env_id"] == ENV
    assert out["rubric"] == {
        "name": "HiddenGameTask",
        "functions": ["names_game", "short_answer"],
        "weights": [1.0, 0.0],
    }
    assert [t["id"] for t in out["tasks"]] == ["hidden-monopoly-0", "hidden-monopoly-1"]
    first = out["tasks"][0]
    assert first["prompt"] == [
        {"role": "user", "content": "What is the most famous board game? Answer with its name only."}
    ]
    assert first["info"]["answer"] == "monopoly" and first["info"]["idx"] == 0


@pytest.mark.slow
def test_run_scores_a_reply_relayed_through_the_server(vf_python) -> None:
    with FakeChatServer(["Monopoly!"]) as server:
        out = _run(vf_python, server, {})
    assert out == {
        "reward": 1.0,
        "metrics": {"names_game": 1.0, "short_answer": 1.0, "reply_chars": 9.0},
        "completion": [{"role": "assistant", "content": "Monopoly!"}],
        "num_calls": 1,
        "error": None,
    }
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == "Bearer sk-lease-test"  # the attempt's key, from OPENAI_API_KEY
    assert headers.get("x-session-id")  # verifiers tags every call of the episode
    body = request["body"]
    assert body["model"] == "policy-m"
    assert body["temperature"] == 0.7
    assert (body.get("max_tokens") or body.get("max_completion_tokens")) == 16
    assert body["messages"][-1]["content"].startswith("What is the most famous board game?")


@pytest.mark.slow
def test_a_wrong_reply_scores_zero(vf_python) -> None:
    with FakeChatServer(["Chess"]) as server:
        out = _run(vf_python, server, {})
    assert out["reward"] == 0.0 and out["error"] is None and out["num_calls"] == 1


@pytest.mark.slow
def test_a_tool_call_round_trips(vf_python) -> None:
    with FakeChatServer([{"tool": "lookup_game", "arguments": {}}, "It is Monopoly"]) as server:
        out = _run(vf_python, server, {"tool": True})
    assert out["reward"] == 1.0, out
    assert out["num_calls"] == 2
    call, result, answer = out["completion"]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == "lookup_game"
    assert result["role"] == "tool" and "Monopoly" in result["content"]
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert answer == {"role": "assistant", "content": "It is Monopoly"}
    first, second = (r["body"] for r in server.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup_game"]  # Chat Completions `tools`
    assert second["messages"][-1]["role"] == "tool"
    sessions = {{k.lower(): v for k, v in r["headers"].items()}["x-session-id"] for r in server.requests}
    assert len(sessions) == 1  # both calls are one episode


@pytest.mark.slow
def test_a_failing_model_is_an_episode_error_not_a_crash(vf_python) -> None:
    with FakeChatServer([{"status": 500}]) as server:
        out = _run(vf_python, server, {})
    assert out["reward"] is None
    assert out["error"]  # the cause, as one string


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--env", "no-such-env", "--env-args", "{}"], "not installed in the verifiers venv"),
        (["--env", ENV, "--env-args", '{"no_such_arg": 1}'], "failed to load"),
        (["--env", ENV, "--env-args", "{nope"], "--env-args is not JSON"),
    ],
)
def test_load_errors_exit_3_with_a_one_line_reason(vf_python, args, reason) -> None:
    done = _drive(vf_python, "list", *args)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert reason in last


@pytest.mark.slow
def test_an_unknown_task_id_is_a_load_error(vf_python) -> None:
    done = _drive(
        vf_python,
        "run",
        "--env",
        ENV,
        "--env-args",
        "{}",
        "--task-id",
        "nope",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--sampling",
        "{}",
    )
    assert done.returncode == 3
    assert "no task with id 'nope'" in done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_config_weight_reaches_the_rubric_and_the_reward(vf_python) -> None:
    env_args = {"task": {"rewards": {"short_answer": {"weight": 0.5}}}}
    out = _json(_drive(vf_python, "list", "--env", ENV, "--env-args", json.dumps(env_args)))
    assert out["rubric"]["weights"] == [1.0, 0.5]
    with FakeChatServer(["Chess"]) as server:
        ran = _run(vf_python, server, env_args)
    assert ran["reward"] == 0.5 and ran["metrics"]["short_answer"] == 1.0


@pytest.mark.slow
def test_serve_runs_many_episodes_in_one_process_through_one_connection_pool(vf_python) -> None:
    """Each episode on its own key, all on one keep-alive connection (issue 44: verifiers 0.4 alone opens a
    pool, and a connection, per episode, as each has its own key variable)."""
    with FakeChatServer(["Monopoly"], keep_alive=True) as server:
        requests = [
            {
                "id": "a",
                "task_id": TASK,
                "base_url": server.base_url,
                "model": "m",
                "sampling": {},
                "api_key": "k-a",
            },
            {
                "id": "b",
                "task_id": TASK,
                "base_url": server.base_url,
                "model": "m",
                "sampling": {},
                "api_key": "k-b",
            },
            {"id": "c", "task_id": "nope", "base_url": server.base_url},
        ]
        done = subprocess.run(
            [str(vf_python), str(DRIVER), "serve", "--env", ENV, "--env-args", "{}", "--max-concurrent", "1"],
            input="".join(json.dumps(r) + "\n" for r in requests),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    ready, *results = (json.loads(line) for line in done.stdout.strip().splitlines())
    listed = _json(_drive(vf_python, "list", "--env", ENV, "--env-args", "{}"))
    assert ready == {"ready": True, **listed}, "the ready line is `list`'s object"
    by_id = {r["id"]: r for r in results}
    assert by_id["a"]["reward"] == 1.0 and by_id["b"]["reward"] == 1.0
    assert by_id["c"]["reward"] is None and "no task with id 'nope'" in by_id["c"]["error"]
    keys = sorted({k.lower(): v for k, v in r["headers"].items()}["authorization"] for r in server.requests)
    assert keys == ["Bearer k-a", "Bearer k-b"]  # each episode on its own key
    assert server.connections == 1, (
        f"two episodes one after another opened {server.connections} connections: they no longer share one "
        "pool (episode_driver._share_one_pool)"
    )
