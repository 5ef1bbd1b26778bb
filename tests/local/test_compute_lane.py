"""The compute lane: all of the embedded Loops' torch work runs on one thread (see `compute_lane`)."""

from __future__ import annotations

import threading

import pytest
from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, TensorData

from loops_nb.local.compute_lane import COMPUTE_LANE, ComputeLane


def test_lane_runs_calls_in_order_on_one_thread_and_hands_back_errors():
    lane = ComputeLane(name="test-lane")
    seen: list[tuple[int, str]] = []

    def work(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * i

    callers = [threading.Thread(target=lambda i=i: lane.run(lambda: work(i))) for i in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert sorted(i for i, _ in seen) == list(range(8))
    assert {name for _, name in seen} == {"test-lane"}
    assert lane.run(lambda: work(9)) == 81

    with pytest.raises(ZeroDivisionError):
        lane.run(lambda: 1 / 0)
    # Work on the lane that needs the lane again runs inline instead of waiting for itself.
    assert lane.run(lambda: lane.run(lambda: threading.current_thread().name)) == "test-lane"
    assert not lane.on_lane()


def test_trainer_ops_and_sampler_batches_compute_on_the_lane(embedded_loops, tiny_chat_model, monkeypatch):
    from loops_nb.local.sampler import SamplerEngine
    from loops_nb.local.trainer import LoraTrainer

    threads: dict[str, set[str]] = {"trainer": set(), "sampler": set()}
    micro_batch, run_batch = LoraTrainer._micro_batch, SamplerEngine._run_batch

    def traced_micro_batch(self, *args, **kwargs):
        threads["trainer"].add(threading.current_thread().name)
        return micro_batch(self, *args, **kwargs)

    def traced_run_batch(self, jobs):
        threads["sampler"].add(threading.current_thread().name)
        return run_batch(self, jobs)

    monkeypatch.setattr(LoraTrainer, "_micro_batch", traced_micro_batch)
    monkeypatch.setattr(SamplerEngine, "_run_batch", traced_run_batch)

    svc = embedded_loops.service_client()
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, seed=0)
    tokens = list(range(5, 17))
    datum = Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[11])},
    )
    tc.forward_backward([datum], loss_fn="cross_entropy").result()
    tc.optim_step(AdamParams(learning_rate=1e-3)).result()
    # Publishing runs a trainer op that hands the adapter to the sampler: on the lane, without deadlock.
    sc = tc.save_weights_and_get_sampling_client("lane-1")
    out = sc.sample(
        ModelInput.from_ints(tokens[:4]), num_samples=2, sampling_params=SamplingParams(max_tokens=3)
    )
    assert len(out.sequences) == 2
    tc.close()
    assert threads == {"trainer": {COMPUTE_LANE.name}, "sampler": {COMPUTE_LANE.name}}


ISOLATION_PROBE = """
import json, os, threading, torch
from loops_nb.local.compute_lane import ComputeLane

def os_threads():
    return len(os.listdir("/proc/self/task"))

def big_op():
    torch.randn(2048, 2048).mul(2)  # large enough for an OpenMP parallel region

start = torch.get_num_threads()
lane = ComputeLane(name="probe-lane")
lane.isolate_threads()
lane.run(big_op)
before = os_threads()
big_op()  # the caller's own torch work
caller_added = os_threads() - before
other = {}

def other_thread():
    started = os_threads()
    big_op()  # a thread whose first torch work comes after isolation
    other.update(threads=torch.get_num_threads(), added=os_threads() - started)

worker = threading.Thread(target=other_thread)
worker.start()
worker.join()
print(json.dumps({
    "start": start, "lane": lane.run(torch.get_num_threads), "caller": torch.get_num_threads(),
    "other": other["threads"], "caller_added": caller_added, "other_added": other["added"],
}))
"""


@pytest.mark.slow
def test_isolated_lane_keeps_the_threads_and_other_threads_start_no_pool():
    """After `isolate_threads` the lane computes on torch's thread count and every other thread on one, so
    their torch work starts no OpenMP pool (no new OS threads) to throttle the lane's."""
    import json
    import os
    import subprocess
    import sys

    # Without the suite's per-worker thread cap (tests/conftest.py): the probe needs torch's own width.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", ISOLATION_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if seen["start"] < 2:
        pytest.skip("torch runs one intra-op thread here: nothing to isolate")
    assert seen["lane"] == seen["start"]
    assert seen["caller"] == 1 and seen["other"] == 1
    assert seen["caller_added"] == 0 and seen["other_added"] == 0


def test_a_cpu_state_isolates_the_lane(embedded_loops):
    assert COMPUTE_LANE.enabled and COMPUTE_LANE.threads is not None
