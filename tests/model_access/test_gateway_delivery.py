"""A completion its agent never got is never trained on: the gateway stops sampling for a client that
left, withdraws a sampled reply it could not deliver, and answers (instead of raising) when the
attempt's loop shuts down under a request.

The sampler is scripted; `Hanging` makes its first calls wait until they are cancelled, as a loaded
sampler keeps a client waiting past its timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import httpx
import openai
import pytest
from scripted_policy import ScriptedPolicy

from loops_nb.connection_guard import CLIENT_CONNECTED
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.model_access.delivery import settle_lease
from loops_nb.rl.datums import sequence_datums
from loops_nb.rl.scheduler import RolloutScheduler
from loops_nb.runtime import Attempt, Evidence, Task

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Hanging:
    """A sampler whose first `hangs` calls never answer (until cancelled); then `inner` answers."""

    version = 0

    def __init__(self, inner: ScriptedPolicy, hangs: int) -> None:
        self.inner, self.hangs = inner, hangs
        self.calls = self.cancelled = 0
        self.started = threading.Event()

    @property
    def sampling_client(self) -> Hanging:
        return self

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        self.calls += 1
        self.started.set()
        if self.calls <= self.hangs:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await self.inner.sample_async(prompt, num_samples, sampling_params)


@pytest.fixture
def hanging(renderer: ChatRenderer) -> Any:
    def make(*texts: str, hangs: int = 1) -> tuple[LoopsLLM, Hanging]:
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        policy = Hanging(ScriptedPolicy(renderer, list(texts), logprob=-0.5, end_token=end), hangs)
        return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64)), policy

    return make


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_client_that_times_out_and_retries_trains_only_the_reply_it_got(
    gateway: ModelGateway, hanging: Any, api: str
) -> None:
    # Spare replies: on a loaded machine a retry may time out too, and is retried in turn.
    llm, policy = hanging(*["The answer is 4."] * 4, hangs=2)
    lease = gateway.issue(f"t/g0/retry-{api}", llm)
    # The openai client's own behaviour: give up after `timeout`, retry up to max_retries times.
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key, timeout=2.0, max_retries=4)
    if api == "chat":
        resp = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "2 + 2?"}]
        )
        got, ids = resp.choices[0].message.content, (resp.model_extra or {})["loops"]["completion_token_ids"]
    else:
        answer = await client.responses.create(model="tiny", input="2 + 2?")
        got, ids = answer.output_text, (answer.model_extra or {})["loops"]["completion_token_ids"]
    gateway.revoke(lease.key)
    await settle_lease(lease)
    assert got == "The answer is 4."
    # The two abandoned requests stopped sampling when their client left, and recorded nothing;
    # every request but the one answered is cut off.
    assert policy.cancelled == 2
    capture = llm.capture
    assert capture.cut_off == policy.calls - 1
    [call] = capture.calls
    assert call.completion_tokens == ids
    assert not capture.breaks
    [datum] = sequence_datums(capture.sequences(), 1.0, lease.attempt_id)
    trained = [t for t, s in zip(datum.tokens, datum.sampled, strict=True) if s]
    assert trained == ids
    assert lease.calls == 1


def request_scope(path: str, key: str, connected: bool) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")],
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        CLIENT_CONNECTED: lambda: connected,
    }


async def call_app(app: Any, path: str, key: str, body: dict[str, Any], *, connected: bool) -> list[Any]:
    """One request straight into the ASGI app, its client gone (or not) by the time the reply is sent."""
    sent: list[Any] = []
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> Any:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client neither sends more nor leaves while it samples

    async def send(message: Any) -> None:
        sent.append(message)

    await app(request_scope(path, key, connected), receive, send)
    return sent


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "stream": True}),
        ("/v1/responses", {"input": "Hi"}),
        ("/v1/responses", {"input": "Hi", "stream": True}),
    ],
    ids=["chat", "chat-stream", "responses", "responses-stream"],
)
async def test_a_reply_sampled_for_a_client_that_left_is_withdrawn(
    gateway: ModelGateway, scripted: Any, path: str, body: dict[str, Any]
) -> None:
    llm, policy = scripted("Lost.", "Kept.")
    lease = gateway.issue("t/g0/gone", llm)
    app = gateway.app()
    await call_app(app, path, lease.key, body, connected=False)
    await settle_lease(lease)  # what LeasedRuntime does when the attempt ends
    assert len(policy.prompts) == 1 and not llm.capture.calls  # sampled, never delivered
    assert llm.capture.cut_off == 1 and lease.calls == 0 and not lease.returned and not lease.responses
    sent = await call_app(app, path, lease.key, body, connected=True)
    await settle_lease(lease)
    assert sent[0]["status"] == 200
    [call] = llm.capture.calls
    assert llm.renderer.decode(call.completion_tokens, skip_special=True) == "Kept."
    # The retry renders against a capture without the lost reply: the same prompt, no break.
    assert policy.prompts[1] == policy.prompts[0] == call.prompt_tokens
    assert not llm.capture.breaks and lease.calls == 1
    gateway.revoke(lease.key)


async def test_a_request_in_flight_when_the_attempts_loop_ends_is_answered_not_raised(
    gateway: ModelGateway, hanging: Any
) -> None:
    llm, policy = hanging("never", hangs=1)
    leased: list[Any] = []
    attempt_over = threading.Event()

    async def attempt() -> None:  # an attempt on a loop of its own, ending with its request unanswered
        leased.append(gateway.issue("t/g0/shutdown", llm))
        await asyncio.to_thread(attempt_over.wait)

    runner = threading.Thread(target=lambda: asyncio.run(attempt()))
    errors: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = errors.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        runner.start()
        while not leased:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=60, base_url=gateway.url) as http:
            pending = asyncio.ensure_future(
                http.post(
                    "/chat/completions",
                    json={"messages": [{"role": "user", "content": "Hi"}]},
                    headers={"Authorization": f"Bearer {leased[0].key}"},
                )
            )
            await asyncio.to_thread(policy.started.wait, 60)
            attempt_over.set()  # asyncio.run cancels what is left on the attempt's loop
            await asyncio.to_thread(runner.join, 60)
            r = await pending
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert r.status_code == 401 and "has ended" in r.json()["error"]["message"]
    assert policy.cancelled == 1 and not llm.capture.calls and llm.capture.cut_off == 1
    assert not [e for e in errors if e.levelno >= logging.ERROR], [e.getMessage() for e in errors]
    gateway.revoke(leased[0].key)


class TimingOutAgent:
    """An agent that calls the gateway and gives up (its own timeout) before the reply, then reports a
    reward anyway, as an agent program's wrapper often does."""

    def __init__(self) -> None:
        self.gave_up = 0

    async def tasks(self) -> list[Task]:
        return [Task("t0")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        client = openai.AsyncOpenAI(
            base_url=attempt.services.model_base_url,
            api_key=attempt.services.model_api_key,
            timeout=1.0,
            max_retries=0,
        )
        try:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}])
        except openai.APITimeoutError:
            self.gave_up += 1
        return Evidence(reward=0.0)

    async def close(self) -> None:
        pass


async def test_an_attempt_cut_off_in_its_model_call_is_a_timeout_not_no_model_calls(
    gateway: ModelGateway, hanging: Any
) -> None:
    agent = TimingOutAgent()
    made: list[Any] = []

    def make_llm(capture: TokenCapture, seed: int) -> LoopsLLM:
        llm, policy = hanging("never", hangs=1)
        llm.capture = capture
        made.append(policy)
        return llm

    scheduler = RolloutScheduler(
        LeasedRuntime(agent, gateway),
        [Task("t0")],
        make_llm=make_llm,
        version=lambda: 0,
        group_size=2,
        groups_per_step=1,
        max_concurrent=2,
        attempt_timeout=120,
        seed=0,
    )
    [group] = await scheduler.collect_sync(0)
    assert agent.gave_up == 2 and all(p.cancelled == 1 for p in made)
    for record in group.attempts:
        assert record.evidence.discarded == "timeout", record.evidence
        assert "cut off in flight" in record.evidence.detail
        assert not record.capture.calls and record.capture.cut_off == 1
