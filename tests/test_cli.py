"""The `loops` command: one clear line for a user's mistake, help from the schema, `serve`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli_in_process, start_cli
from rl_config import rl_config_toml

from loops_nb.config import split_overrides
from loops_nb.errors import UserError

REPO = Path(__file__).resolve().parents[1]
GOOD = rl_config_toml("episode:HiddenGame")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (GOOD + "[training]\nmax_stepz = 3\n", "unknown key training.max_stepz; did you mean 'max_steps'?"),
        (GOOD + '[training]\nmax_steps = "ten"\n', "training.max_steps: Input should be a valid integer"),
        (GOOD + '[compute]\nscope = "serverless"\nreplicas = 2\n', "compute.replicas: sizes a deployment"),
    ],
)
def test_check_refuses_bad_configs_with_one_line(tmp_path, body, needle):
    cfg = tmp_path / "train.toml"
    cfg.write_text(body)
    code, _, err = run_cli_in_process("check", str(cfg))
    assert code == 2
    assert needle in err and str(cfg) in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_check_refuses_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli_in_process("check", "missing.toml")
    assert code == 2 and "missing.toml: no such config file" in err


def test_overrides_on_the_command_line(tmp_path):
    assert split_overrides(["--training.max_steps", "5", "--compute.scope=local"]) == {
        "training.max_steps": 5,
        "compute.scope": "local",
    }
    with pytest.raises(UserError, match="needs a value"):
        split_overrides(["--training.max_steps"])
    cfg = tmp_path / "train.toml"
    cfg.write_text(GOOD)
    code, _, err = run_cli_in_process("check", str(cfg), "--training.group_size", "0")
    assert code == 2 and "override --training.group_size" in err


def test_run_help_lists_every_setting_with_its_default():
    code, out, _ = run_cli_in_process("run", "--help")
    assert code == 0
    assert "--training.max_steps int  (default 10)" in out
    assert "--training.batch_tokens" in out and "--data.train" in out  # the SFT recipe's settings too


def test_serverless_without_a_key_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BASETEN_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    from loops_nb.compute import require_api_key

    with pytest.raises(UserError, match='compute.scope = "serverless" needs BASETEN_API_KEY'):
        require_api_key("serverless")


@pytest.mark.slow
def test_loops_serve_runs_an_unchanged_sdk_script(tmp_path, tiny_chat_model_path):
    server = start_cli(
        "serve",
        "--state-dir",
        tmp_path / "state",
        "--device",
        "cpu",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        env_lines: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(env_lines) < 2 and time.monotonic() < deadline:
            line = server.stdout.readline()
            if "=" in line:
                key, _, value = line.strip().partition("=")
                env_lines[key] = value
        assert set(env_lines) == {"LOOPS_BASE_URL", "BASETEN_API_KEY"}
        assert env_lines["LOOPS_BASE_URL"].startswith("http://127.0.0.1:")
        script = f"""
from baseten.loops import AdamParams, Datum, ModelInput, ServiceClient, TensorData
svc = ServiceClient()   # reads LOOPS_BASE_URL and BASETEN_API_KEY, as against Baseten
tc = svc.create_lora_training_client(base_model={str(tiny_chat_model_path)!r}, rank=4)
ids = list(range(5, 25))
d = Datum(model_input=ModelInput.from_ints(ids[:-1]),
          loss_fn_inputs={{"target_tokens": TensorData(data=ids[1:], dtype="int64", shape=[19])}})
print("loss", tc.forward_backward([d]).result().loss)
tc.optim_step(AdamParams(learning_rate=1e-3)).result()
print("policy_version", tc.policy_version)
"""
        env = {**os.environ, **env_lines}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "policy_version 1" in done.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
