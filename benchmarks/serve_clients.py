"""`loops serve` with several live training clients on one base model: its resident memory after each.

Run by `benchmarks.peak_memory` (`python benchmarks/serve_clients.py 4`); prints a JSON list of the
server's resident bytes after 1..N clients have each trained and published one step, all still open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def main(clients: int) -> list[int]:
    from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient, TensorData

    server = subprocess.Popen(
        [sys.executable, "-m", "loops_nb.cli", "serve", "--model", MODEL],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    env = {}
    assert server.stdout is not None
    while len(env) < 2:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("loops serve exited before printing its address")
        if "=" in line and line.split("=", 1)[0] in {"LOOPS_BASE_URL", "BASETEN_API_KEY"}:
            key, value = line.strip().split("=", 1)
            env[key] = value
    try:
        service = ServiceClient(base_url=env["LOOPS_BASE_URL"], api_key=env["BASETEN_API_KEY"])
        tokens = list(range(100, 229))
        datum = Datum(
            model_input=ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[128])},
        )
        held, sizes = [], []
        for _ in range(clients):
            tc = service.create_lora_training_client(base_model=MODEL, rank=16)
            tc.forward_backward([datum] * 4, loss_fn="cross_entropy").result()
            tc.optim_step(AdamParams(learning_rate=1e-4)).result()
            sc = tc.save_weights_and_get_sampling_client()
            sc.sample(
                ModelInput.from_ints(tokens[:20]), num_samples=4, sampling_params=SamplingParams(max_tokens=8)
            )
            held.append((tc, sc))
            time.sleep(1.0)
            sizes.append(psutil.Process(server.pid).memory_info().rss)
        return sizes
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
