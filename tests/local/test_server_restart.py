"""A `loops serve` that dies mid-run, comes back, pauses, or never returns.

The trainer's live state (the LoRA weights and optimizer since the last checkpoint) lives only in the
server process. So a run whose server was killed and restarted must stop with `RunFailed` and resume
from its last checkpoint, never carry on against a fresh adapter; a paused server is ridden out by the
SDK's retries; a server that never returns stops the run within the SDK's retry window.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from helpers import read_jsonl
from rl_config import tiny_run_toml

from loops_nb import load
from loops_nb.errors import RunFailed

API_KEY = "loops-restart-test-key"

EPISODE = """
from loops_nb.episodes import Episode, Task
from loops_nb.llm.client import llm


class Lengthy(Episode):
    def tasks(self):
        return [Task(str(i), {}) for i in range(5)]

    async def run(self, task):
        reply = await llm().chat([{"role": "user", "content": "Talk."}], max_tokens=8)
        return (len(reply.text) % 4) / 3  # within the default reward range, -1..1
"""

SERVE = """
import sys
import loops_nb.local.embedded  # torch and the app: most of a cold start, paid before the go-ahead
from loops_nb.cli import main
if sys.stdin.readline() != "go\\n":
    sys.exit(0)  # the test ended (its pipe closed) without needing this spare
sys.exit(main(sys.argv[1:]))
"""


class ServeProcess:
    """`loops serve` on one port and state directory, killed, paused and restarted by the test.

    `prepare_restart` has a spare process imported and waiting, so a restart binds in about a second (a
    cold start spends most of its time importing torch) and the SDK's backoff, not the import, paces it.
    """

    def __init__(self, state_dir: Path, log: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir, self.log = state_dir, log
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "LOOPS_LOCAL_API_KEY": API_KEY}
        self.proc: subprocess.Popen[bytes] | None = None
        self.spare: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        argv = ["serve", "--port", str(self.port), "--state-dir", str(self.state_dir), "--device", "cpu"]
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-c", SERVE, *argv],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
            )

    def prepare_restart(self) -> None:
        """Have a spare imported and waiting, so the next `start` binds at once."""
        if self.spare is None:
            self.spare = self._spawn()

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def start(self) -> None:
        proc, self.spare = self.spare or self._spawn(), None
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        self.proc = proc
        for _ in range(1200):
            assert proc.poll() is None, f"loops serve exited: {self.log.read_text()[-2000:]}"
            try:
                resp = httpx.get(
                    f"{self.url}/v1/loops/capabilities", headers={"Authorization": f"Api-Key {API_KEY}"}
                )
                if resp.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            threading.Event().wait(0.1)
        raise AssertionError("loops serve did not answer within 120 s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def close(self) -> None:
        for proc in (self.proc, self.spare):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("serve")
    server = ServeProcess(root / "state", root / "serve.log")
    yield server
    server.close()


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASETEN_API_KEY", API_KEY)
    monkeypatch.delenv("LOOPS_BASE_URL", raising=False)


def write_config(tmp_path: Path, model: Path, url: str, name: str, max_steps: int) -> Path:
    (tmp_path / "lengthy.py").write_text(EPISODE)
    config = tmp_path / f"{name}.toml"
    config.write_text(
        tiny_run_toml(
            "lengthy:Lengthy",
            model,
            tmp_path / "runs",
            # the `loops serve` under test, with its own settings: no embedded Loops to configure
            compute={"base_url": url, "local": None},
            training={
                "max_steps": max_steps,
                "groups_per_step": 2,
                "learning_rate": 1e-3,
                "save_every": 1,
            },
            output={"run_name": name},
        )
    )
    return config


def steps_of(run: Path) -> list[dict]:
    return read_jsonl(run / "steps.jsonl", missing_ok=True)


async def train_and_meanwhile(
    config: Path, run: Path, after_steps: int, fault: Callable[[], Awaitable[None]]
) -> object:
    """Train `config` in this process; once `after_steps` steps are logged, inject `fault`."""
    training = asyncio.create_task(load(config).train())
    async with asyncio.timeout(300):
        while not training.done() and len(steps_of(run)) < after_steps:
            await asyncio.sleep(0.05)
        assert not training.done(), f"the run ended before the fault: {training}"
        await fault()
        return await training


def assert_every_step_once(run: Path, max_steps: int) -> None:
    steps = steps_of(run)
    assert [s["step"] for s in steps] == list(range(max_steps)), "every step exactly once, in order"
    trained = [s for s in steps if s["trained"]]
    # The policy version counts optimizer steps. A resumed trainer continues the count from its
    # checkpoint; one that silently restarted on a fresh adapter would count from 1 again.
    assert [s["policy_version"] for s in trained] == list(range(1, len(trained) + 1))


@pytest.mark.slow
def test_a_restarted_server_stops_the_run_which_then_resumes_once(
    serve: ServeProcess, tiny_chat_model_path: Path, tmp_path: Path, api_key: None
) -> None:
    serve.ensure_running()
    serve.prepare_restart()
    config = write_config(tmp_path, tiny_chat_model_path, serve.url, "restarted", max_steps=5)
    run = tmp_path / "runs" / "restarted"

    async def kill_and_restart() -> None:
        serve.kill()
        serve.start()

    with pytest.raises(RunFailed) as failed:
        asyncio.run(train_and_meanwhile(config, run, after_steps=2, fault=kill_and_restart))
    failure = failed.value
    message = str(failure)
    assert "Loops server restarted" in message and "last checkpoint" in message
    assert "--output.run_name restarted" in message
    assert isinstance(failure.cause, httpx.HTTPStatusError) and failure.cause.response.status_code == 410
    assert 1 <= failure.resume_step <= failure.step < 5
    kept = [s["step"] for s in steps_of(run)]
    assert kept[: failure.resume_step] == list(range(failure.resume_step))

    outcome = asyncio.run(load(config).train())  # the same run name: resumed, against the new server
    assert outcome.status == "completed" and outcome.start_step == failure.resume_step
    assert_every_step_once(run, 5)
    meta = json.loads((run / "run.json").read_text())
    assert len(meta["run_ids"]) == 2, "the resume is a new Loops run on the restarted server"


@pytest.mark.slow
def test_a_paused_server_is_ridden_out(
    serve: ServeProcess, tiny_chat_model_path: Path, tmp_path: Path, api_key: None
) -> None:
    serve.ensure_running()
    config = write_config(tmp_path, tiny_chat_model_path, serve.url, "paused", max_steps=4)
    run = tmp_path / "runs" / "paused"

    async def pause() -> None:
        serve.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(3)
        finally:
            serve.signal(signal.SIGCONT)

    outcome = asyncio.run(train_and_meanwhile(config, run, after_steps=1, fault=pause))
    assert outcome.status == "completed"  # type: ignore[attr-defined]
    assert_every_step_once(run, 4)
    assert all(s["attempts/discarded"] == 0 for s in steps_of(run)), "no attempt lost to the pause"


@pytest.mark.slow
def test_a_server_that_never_returns_stops_the_run(
    serve: ServeProcess,
    tiny_chat_model_path: Path,
    tmp_path: Path,
    api_key: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK's retry window for a `loops serve` is 10 minutes; shortened so the test waits seconds.
    monkeypatch.setattr("loops_nb.compute.LOCAL_SERVER_READY_TIMEOUT_SECONDS", 3.0)
    serve.ensure_running()
    config = write_config(tmp_path, tiny_chat_model_path, serve.url, "abandoned", max_steps=5)
    run = tmp_path / "runs" / "abandoned"

    async def kill() -> None:
        serve.kill()

    with pytest.raises(RunFailed) as failed:
        asyncio.run(train_and_meanwhile(config, run, after_steps=1, fault=kill))
    message = str(failed.value)
    assert "--output.run_name abandoned" in message
    # A trainer call gave up: a submit on its connection error, or a poll at the end of its window.
    assert isinstance(failed.value.cause, httpx.TransportError | TimeoutError), message
    if isinstance(failed.value.cause, httpx.TransportError):
        assert f"127.0.0.1:{serve.port}" in message, "the message names the server that went away"


def test_requests_for_a_lost_run_get_a_terminal_error(tiny_chat_model_path: Path, tmp_path: Path) -> None:
    """The real SDK, then raw HTTP, against a server restarted on the same state directory and port."""
    from baseten.loops import ModelInput, SamplingParams

    from loops_nb.local.embedded import EmbeddedLoops

    model = str(tiny_chat_model_path)
    first = EmbeddedLoops(state_dir=tmp_path / "state", device="cpu").start()
    service = first.service_client()
    tc = service.create_lora_training_client(base_model=model, rank=4)
    sampler = tc.save_weights_and_get_sampling_client("v0")
    base = service.create_sampling_client(base_model=model)
    run_id, port = tc.run_id, first.port
    first.stop()
    second = EmbeddedLoops(
        state_dir=tmp_path / "state", device="cpu", port=port, api_key=first.api_key
    ).start()
    try:
        prompt = ModelInput.from_ints([1, 2, 3])
        params = SamplingParams(max_tokens=2, temperature=0.0)
        outcomes: dict[str, BaseException | object] = {}

        def call(name: str, fn: Callable[[], object]) -> None:
            try:
                outcomes[name] = fn()
            except BaseException as exc:  # recorded for the assertions below
                outcomes[name] = exc

        # The SDK retries 400/404/408/502 for an hour; a 410 must reach the caller at once. A worker
        # thread bounds the wait, so a regression fails here instead of hanging the suite.
        calls = {
            "save_state": lambda: tc.save_state("after-restart").result(),
            "sample": lambda: sampler.sample(prompt, num_samples=1, sampling_params=params),
            "base_sample": lambda: base.sample(prompt, num_samples=1, sampling_params=params),
        }
        for name, fn in calls.items():
            worker = threading.Thread(target=call, args=(name, fn), daemon=True)
            worker.start()
            worker.join(timeout=120)
            assert name in outcomes, f"{name} against a lost run did not return within 120 s"
        for name in ("save_state", "sample"):
            exc = outcomes[name]
            assert isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 410, exc
            assert "Loops server restarted" in str(exc) and "last checkpoint" in str(exc)
        # A base-model sampler holds no state: the restarted server serves it as before.
        assert len(outcomes["base_sample"].sequences) == 1  # type: ignore[union-attr]

        headers = {"Authorization": f"Api-Key {second.api_key}"}
        with httpx.Client(base_url=second.url, headers=headers) as http:
            lost = [
                http.post(f"/trainers/{run_id}/optim_step", json={}, headers={"Idempotency-Key": "k1"}),
                http.get(f"/trainers/{run_id}/operations/k1"),
                http.get(f"/trainers/{run_id}/policy_version"),
                http.get(f"/trainers/{run_id}/health"),
                http.get(f"/samplers/smp-{run_id}/trainers_policy_version"),
                http.get(f"/samplers/smp-{run_id}/v1/models"),
            ]
            for resp in lost:
                assert resp.status_code == 410, (resp.request.url, resp.text)
                assert run_id in resp.json()["detail"]
            status = http.get(f"/v1/loops/deployments/dep-{run_id}").json()
            assert status["deployment"]["status"]["name"] == "INACTIVE"
            ended = http.post(f"/v1/loops/runs/{run_id}/deactivate")
            assert ended.status_code == 200 and ended.json()["run"]["changed"] is False
            # A run no process of this server created is still unknown (422), not lost.
            for unknown in ("run-000000000000", "..%2F..%2Fetc"):
                resp = http.get(f"/trainers/{unknown}/policy_version")
                assert resp.status_code in (404, 422) and "gone" not in resp.text
            # The lost run's checkpoints stay listed: a resume finds them.
            assert http.get("/v1/loops/checkpoints", params={"run_id": run_id}).status_code == 200
    finally:
        second.stop()
