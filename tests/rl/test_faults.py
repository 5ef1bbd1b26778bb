"""Faults during an RL run, injected into a scripted trainer and sampler: each is retried, discarded with
its reason, or stops the run cleanly with resumable state — and the logs stay consistent."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Imported now, not by the first attempt's model call (LoopsLLM imports it then): on a loaded machine that
# import holds the event loop for seconds, past the short attempt timeouts some tests here set.
import baseten.loops  # noqa: F401
import pytest
from helpers import Done, read_jsonl

from loops_nb import load
from loops_nb.episodes import Episode, EpisodeRuntime, Evidence, Task, load_runtime, run_blocking
from loops_nb.errors import RunFailed
from loops_nb.llm.client import llm
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.observers import ObserverSet
from loops_nb.rl.loop import RLRun
from loops_nb.rl.policy import Policy
from loops_nb.run_dir import RunDirectory

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "patterns/custom_runtime/in_process_direct/train_local.toml"


MONOPOLY = [11278, 32969, 2]  # SmolLM2's tokens for "Monopoly" and its end of turn (checked below)


class ScriptedSampler:
    """Answers right on even calls and wrong on odd ones, so groups have reward variance and train;
    `fail` / `hang` make chosen calls misbehave."""

    def __init__(
        self,
        fail: set[int] | None = None,
        hang: set[int] | None = None,
        gone_from: int | None = None,
        gone_with: Any = None,
    ) -> None:
        self.calls = 0
        self.fail, self.hang, self.gone_from = fail or set(), hang or set(), gone_from
        self.gone_with = gone_with or gone

    async def sample_async(self, model_input: Any, num_samples: int, sampling_params: Any) -> Any:
        self.calls += 1
        if self.gone_from is not None and self.calls >= self.gone_from:
            raise self.gone_with()
        if self.calls in self.fail:
            raise ConnectionError("sampler returned 503 after the SDK's retries")
        if self.calls in self.hang:
            await asyncio.sleep(3600)
        tokens = MONOPOLY if self.calls % 2 == 0 else [44, 45, 46, 2]
        seq = SimpleNamespace(tokens=tokens, logprobs=[-1.0] * len(tokens), stop_reason="stop")
        return SimpleNamespace(sequences=[seq] * num_samples, policy_version=None)


def gone() -> Exception:
    """What the SDK raises when a restarted `loops serve` answers for a run it lost."""
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1:9/samplers/smp-scripted/sample")
    response = httpx.Response(410, request=request, text="run scripted is gone: the Loops server restarted")
    return httpx.HTTPStatusError(
        "410 Gone: run scripted is gone: the Loops server restarted", request=request, response=response
    )


class ScriptedTrainer:
    """A training client whose chosen calls fail: `fail_forward_at` (1-based calls), `disk_full_at_save`."""

    run_id = "scripted"

    def __init__(
        self,
        sampler: ScriptedSampler,
        fail_forward_at: int | None = None,
        disk_full_at_save: int | None = None,
        fail_sampler_save: bool = False,
    ):
        self.sampler = sampler
        self.fail_forward_at, self.disk_full_at_save = fail_forward_at, disk_full_at_save
        self.fail_sampler_save = fail_sampler_save
        self.forwards = self.saves = 0

    async def forward_backward_async(
        self, data: Any, loss_fn: str = "cross_entropy", loss_fn_config: Any = None
    ) -> Done:
        self.forwards += 1
        if self.forwards == self.fail_forward_at:
            raise RuntimeError("trainer operation failed: CUDA error: an illegal memory access")
        outputs = [{"logprobs": SimpleNamespace(data=list(d.loss_fn_inputs["logprobs"].data))} for d in data]
        return Done(SimpleNamespace(loss=0.0, loss_fn_outputs=outputs, metrics={}))

    async def optim_step_async(self, params: Any) -> Done:
        return Done(SimpleNamespace(metrics={}))

    async def save_weights_and_get_sampling_client_async(self, name: str) -> ScriptedSampler:
        return self.sampler

    async def save_state_async(self, name: str) -> Done:
        self.saves += 1
        if self.saves == self.disk_full_at_save:
            raise OSError(errno.ENOSPC, "No space left on device")
        return Done(SimpleNamespace(path=f"scripted://{name}"))

    async def save_weights_for_sampler_async(self, name: str) -> Done:
        if self.fail_sampler_save:
            raise gone()
        return Done(SimpleNamespace(path=f"scripted://sampler/{name}"))


def make_run(
    tmp_path: Path, trainer: ScriptedTrainer, *, observers: Sequence[object] = (), **training: Any
) -> RLRun:
    from loops_nb.model_renderer import load_model_tokenizer

    overrides = {
        "output.output_dir": str(tmp_path),
        "training.max_steps": 4,
        "training.group_size": 2,
        "training.groups_per_step": 2,
        "training.save_every": 1,
        "eval.enabled": False,  # the quickstart evaluates; these faults are about training attempts
        **{f"training.{k}": v for k, v in training.items()},
    }
    config = load(QUICKSTART, overrides=overrides).config
    renderer = ChatRenderer(load_model_tokenizer(config.model, "local"))
    runtime = load_runtime(config.runtime.factory, config.runtime.options)
    return RLRun(
        config,
        RunDirectory(tmp_path / "run"),
        Policy(trainer, "scripted"),
        runtime,
        renderer,
        ObserverSet(observers),
    )


def test_the_scripted_right_answer_is_monopoly() -> None:
    from transformers import AutoTokenizer

    from loops_nb.local.model_store import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct").path)
    assert "monopoly" in tokenizer.decode(MONOPOLY[:-1]).lower()


async def test_a_trainer_error_stops_the_run_cleanly_and_it_resumes_where_it_stopped(tmp_path: Path) -> None:
    sampler = ScriptedSampler()
    run = make_run(tmp_path, ScriptedTrainer(sampler, fail_forward_at=3))
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    failure = info.value
    assert failure.step == 2 and failure.resume_step == 2
    assert "stopped at step 2" in str(failure) and "--output.run_name run" in str(failure)
    assert "CUDA error" in str(failure)
    root = tmp_path / "run"
    assert [s["step"] for s in read_jsonl(root / "steps.jsonl")] == [0, 1], "no half-recorded step"
    assert "failed: run" in (root / "run.log").read_text()

    # Resume from the last checkpoint with a healthy trainer: every step exactly once.
    resumed = make_run(tmp_path, ScriptedTrainer(sampler))
    resumed.policy.load_state_with_optimizer = _no_load  # the scripted trainer keeps no state
    start = await resumed.resume_point()
    assert start == 2
    outcome = await resumed.execute(start)
    assert outcome.status == "completed"
    assert [s["step"] for s in read_jsonl(root / "steps.jsonl")] == [0, 1, 2, 3]
    assert sorted({r["step"] for r in read_jsonl(root / "rollouts.jsonl")}) == [0, 1, 2, 3]
    assert len(read_jsonl(root / "rollouts.jsonl")) == 4 * 4, "no rollout recorded twice"


async def _no_load(path: str) -> int:
    return 0


async def test_a_full_disk_when_saving_a_checkpoint_stops_the_run_with_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    run = make_run(tmp_path, ScriptedTrainer(ScriptedSampler(), disk_full_at_save=2))
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    assert "No space left on device" in str(info.value)
    assert info.value.resume_step == 1, "the checkpoint that was written is the one to resume from"
    checkpoints = read_jsonl(tmp_path / "run" / "checkpoints.jsonl")
    assert [c["step"] for c in checkpoints] == [1]


async def test_sampler_errors_and_hangs_discard_those_attempts_and_the_run_goes_on(tmp_path: Path) -> None:
    sampler = ScriptedSampler(fail={1, 2}, hang={3})
    run = make_run(tmp_path, ScriptedTrainer(sampler), attempt_timeout_seconds=2, max_steps=2)
    outcome = await run.execute(0)
    assert outcome.status == "completed"
    records = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    reasons = [r["discarded"] for r in records if r["discarded"]]
    assert sorted(reasons) == ["error", "error", "timeout"]
    assert any("503" in r["detail"] for r in records)
    assert sum(r["discarded"] is None for r in records) == len(records) - 3


async def test_a_rerun_of_a_finished_run_trains_and_saves_nothing(tmp_path: Path) -> None:
    trainer = ScriptedTrainer(ScriptedSampler())
    run = make_run(tmp_path, trainer, max_steps=2)
    outcome = await run.execute(0)
    # A rerun is answered from these files before any trainer exists (`run_recipe`, through
    # `Recipe.finished`; tests/rl/test_finished_rerun.py runs it end to end with no Loops connection at all):
    # the run's final checkpoint holds every step and the sampler weights, so nothing is trained or saved.
    done = run.run_dir.finished(2)
    assert done is not None and (done.step, done.sampler_path) == (2, outcome.sampler_path)


@pytest.mark.parametrize("how", ["410 from a restarted server", "unreachable after the SDK's retries"])
async def test_a_sampler_that_lost_the_run_stops_it_at_that_step(tmp_path: Path, how: str) -> None:
    """Not one failed attempt but Loops itself gone: every later attempt would fail too, so the run stops
    with RunFailed at the end of the step instead of logging untrained steps until the trainer notices."""
    import httpx

    def unreachable() -> Exception:
        return httpx.ConnectError("All connection attempts failed")

    # Step 0 samples calls 1-4; every call of step 1 fails.
    sampler = ScriptedSampler(gone_from=5, gone_with=gone if how.startswith("410") else unreachable)
    trainer = ScriptedTrainer(sampler)
    run = make_run(tmp_path, trainer)
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    assert info.value.step == 1 and info.value.resume_step == 1
    assert ("restarted" in str(info.value)) if how.startswith("410") else ("ConnectError" in str(info.value))
    root = tmp_path / "run"
    assert [s["step"] for s in read_jsonl(root / "steps.jsonl")] == [0], "the lost step is not recorded"
    assert sorted({r["step"] for r in read_jsonl(root / "rollouts.jsonl")}) == [0]
    assert trainer.forwards == 1, "nothing trained after Loops was gone"


async def test_a_plain_sampler_error_is_not_taken_for_a_lost_run() -> None:
    import httpx

    from loops_nb.rl.policy import run_is_gone

    request = httpx.Request("POST", "http://x/sample")
    assert run_is_gone(gone())
    assert run_is_gone(httpx.ConnectError("refused", request=request))
    assert not run_is_gone(
        httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))
    )
    assert not run_is_gone(httpx.ReadTimeout("slow", request=request))
    assert not run_is_gone(ConnectionError("sampler returned 503 after the SDK's retries"))


async def test_a_failed_final_checkpoint_is_a_run_failure_with_the_resume_command(tmp_path: Path) -> None:
    run = make_run(tmp_path, ScriptedTrainer(ScriptedSampler(), fail_sampler_save=True), max_steps=2)
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    # The final checkpoint is not recorded, so a resume starts from the last periodic one (step 1).
    assert info.value.step == 2 and info.value.resume_step == 1
    assert "--output.run_name run" in str(info.value)
    assert [c["step"] for c in read_jsonl(tmp_path / "run" / "checkpoints.jsonl")] == [1]
    assert [s["step"] for s in read_jsonl(tmp_path / "run" / "steps.jsonl")] == [0, 1]


ATTEMPT_TIMEOUT = 3.0
"""The attempts' timeout in the loop-blocking test: above the watchdog's BLOCK_SECONDS (2 s), so the block
is recorded before it outlasts the timeout, and far above what a well-behaved attempt here needs."""


class BlockReported(logging.Handler):
    """Set from the watchdog's thread when it reports a task blocking the event loop."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "is blocking the event loop" in record.getMessage():
            self.seen.set()


class Troubled(Episode):
    """In step 0, attempt 0 blocks the event loop past the attempts' timeout, attempt 1 returns a string
    reward and attempt 2 returns 1e308. Every other attempt does its slow part in a thread, as it should,
    and is graded."""

    def __init__(self, reported: threading.Event) -> None:
        super().__init__()
        self.calls = 0
        self.reported = reported
        self.others_parked = asyncio.Event()
        self.released = threading.Event()

    def tasks(self) -> list[Task]:
        return [Task("hidden", {"answer": "monopoly"})]

    async def run(self, task: Task) -> Any:
        n, self.calls = self.calls, self.calls + 1
        if n == 0:
            await self.others_parked.wait()  # the other attempts of step 0 are in flight when it blocks
        else:
            if n == 3:  # the last of step 0: attempts 1 and 2 are already parked
                self.others_parked.set()
            # Parked in a thread until the block is over: in flight throughout it, their timers falling due.
            await run_blocking(self.released.wait, 60)
        reply = await llm().chat([{"role": "user", "content": "Name a board game."}])
        if n == 0:
            try:
                self.hold_the_loop()
            finally:
                self.released.set()
        return {1: "0.5", 2: Evidence(reward=1e308)}.get(
            n, 1.0 if "monopoly" in reply.content.lower() else 0.0
        )

    def hold_the_loop(self) -> None:
        """Blocking code in the loop's thread, held until the watchdog has reported it and it has outlasted
        every in-flight attempt's timeout (they started before it): then it must be discarded as
        `blocked_loop` and the others must be excused. Bounded, should the report never come."""
        held_since = time.monotonic()
        while time.monotonic() - held_since < 60:
            if self.reported.is_set() and time.monotonic() - held_since > ATTEMPT_TIMEOUT:
                return
            time.sleep(0.01)


async def test_bad_attempts_are_discarded_and_the_run_finishes_with_the_others(tmp_path: Path) -> None:
    """A string reward, a reward of 1e308 and a block of the loop longer than the attempts' timeout: each
    discards its own attempt, with its reason; the attempts in flight meanwhile are not timed out."""
    run = make_run(
        tmp_path, ScriptedTrainer(ScriptedSampler()), max_steps=2, attempt_timeout_seconds=ATTEMPT_TIMEOUT
    )
    reports = BlockReported()
    watchdog_log = logging.getLogger("loops_nb.rl.loop_watchdog")
    watchdog_log.addHandler(reports)
    try:
        run.runtime = EpisodeRuntime(Troubled(reports.seen))
        outcome = await run.execute(0)
    finally:
        watchdog_log.removeHandler(reports)
    assert outcome.status == "completed" and outcome.steps == 2
    root = tmp_path / "run"
    assert [s["step"] for s in read_jsonl(root / "steps.jsonl")] == [0, 1]
    records = read_jsonl(root / "rollouts.jsonl")
    discarded = {r["discarded"]: r["detail"] for r in records if r["discarded"]}
    assert sorted(r["discarded"] for r in records if r["discarded"]) == [
        "blocked_loop",
        "invalid_reward",
        "invalid_reward",
    ]
    assert "in hold_the_loop: time.sleep(0.01)" in discarded["blocked_loop"], discarded["blocked_loop"]
    details = " | ".join(r["detail"] for r in records if r["discarded"] == "invalid_reward")
    assert "reward '0.5' is a str" in details and "reward 1e+308 is outside" in details
    kept = [r for r in records if not r["discarded"]]
    assert len(kept) == len(records) - 3 == 2 * 4 - 3  # two steps of two groups of two
    assert all(r["reward"] in (0.0, 1.0) for r in kept)


async def test_a_run_failure_is_raised_once_and_its_traceback_goes_to_run_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`loops run` prints the RunFailed it gets as its one line: nothing else may print it, or a traceback."""
    run = make_run(tmp_path, ScriptedTrainer(ScriptedSampler(), fail_forward_at=1))
    with pytest.raises(RunFailed):
        await run.execute(0)
    assert not [r for r in caplog.records if "stopped at step" in r.getMessage() or r.exc_info], caplog.text
    log_text = (tmp_path / "run" / "run.log").read_text()
    assert "failed: run" in log_text and "Traceback (most recent call last)" in log_text
    assert "CUDA error: an illegal memory access" in log_text.split("Traceback", 1)[1]


async def test_a_disk_full_stop_is_a_run_failure_even_when_run_log_cannot_be_written(tmp_path: Path) -> None:
    run = make_run(tmp_path, ScriptedTrainer(ScriptedSampler(), disk_full_at_save=2))
    (tmp_path / "run" / "run.log").mkdir()  # writing the failure note fails, as on a full disk
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    assert "No space left on device" in str(info.value) and info.value.resume_step == 1


class TasksRaise(Episode):
    def tasks(self) -> list[Task]:
        raise OSError("tasks.jsonl: No such file or directory")


async def test_tasks_that_raise_stop_the_run_with_run_failed_and_a_failed_line(tmp_path: Path) -> None:
    run = make_run(tmp_path, ScriptedTrainer(ScriptedSampler()))
    run.runtime = EpisodeRuntime(TasksRaise())
    with pytest.raises(RunFailed) as info:
        await run.execute(0)
    assert "stopped at step 0: OSError: tasks.jsonl" in str(info.value)
    assert "failed: run" in (tmp_path / "run" / "run.log").read_text()
