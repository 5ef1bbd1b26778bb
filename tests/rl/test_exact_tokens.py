"""The tokens sent to the trainer are byte-for-byte the tokens the sampler returned, multi-turn too.

A three-turn Episode runs through `loops run` on the embedded Loops with the SDK's own wire log
(`LOOPS_REQUEST_LOG`): every `/sample` exchange and every `/forward_backward` body is recorded as it
crossed the wire, and the test joins them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import read_jsonl, run_cli
from rl_config import tiny_run_toml
from tiny_models import build_tiny_chat_model

EPISODE = """
from loops_nb.episodes import Episode, Task
from loops_nb.llm.client import llm


class ThreeTurns(Episode):
    def tasks(self):
        return [Task("a", {}), Task("b", {})]

    async def run(self, task):
        messages = [{"role": "user", "content": "Say something."}]
        texts = []
        for follow_up in ("And once more.", "Last one.", None):
            reply = await llm().chat(messages, max_tokens=6)
            texts.append(reply.text)
            if follow_up:
                messages += [reply.message, {"role": "user", "content": follow_up}]
        return (len("".join(texts)) % 3) / 2  # within the default reward range, -1..1
"""


def runs(mask: list[float]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0.0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.slow
def test_trained_tokens_are_exactly_the_sampled_tokens_across_turns(tmp_path: Path) -> None:
    model = build_tiny_chat_model(tmp_path / "model")
    (tmp_path / "three_turns.py").write_text(EPISODE)
    config = tmp_path / "train.toml"
    config.write_text(
        tiny_run_toml(
            "three_turns:ThreeTurns",
            model,
            tmp_path / "runs",
            model={"max_seq_len": 512},
            sampling={"max_tokens": 6},
            training={"max_steps": 2, "groups_per_step": 2, "learning_rate": 1e-3, "save_every": 0},
            output={"run_name": "exact", "trace": "full"},
        )
    )
    wire_log = tmp_path / "wire.jsonl"
    proc = run_cli(
        "run",
        config,
        env={"LOOPS_REQUEST_LOG": str(wire_log), "HF_HUB_OFFLINE": "1"},
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    records = read_jsonl(wire_log)
    requests = {r["seq"]: r for r in records if r["kind"] == "request"}
    sampled: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    datums = []
    for r in records:
        if r["kind"] != "response" or r["seq"] not in requests:
            continue
        req = requests[r["seq"]]
        if req["path"].endswith("/sample") and r["status"] == 200:
            for choice in r["body"]["choices"]:
                completion = tuple(choice["token_ids"])
                sampled.setdefault(completion, []).append(
                    (req["body"]["prompt"], choice["logprobs"]["token_logprobs"])
                )
        elif req["path"].endswith("/forward_backward"):
            datums += req["body"]["data"]
    assert datums and sampled

    multi_turn = 0
    for datum in datums:
        inputs = datum["loss_fn_inputs"]
        tokens = [t for c in datum["model_input"]["chunks"] for t in c["tokens"]]
        targets, mask = inputs["target_tokens"]["data"], inputs["mask"]["data"]
        sequence = [*tokens, targets[-1]]
        trained_runs = runs(mask)
        multi_turn += len(trained_runs) > 1
        for start, end in trained_runs:
            completion = tuple(targets[start:end])
            assert completion in sampled, "a trained run is not a completion the sampler returned"
            context = sequence[: start + 1]  # target i predicts sequence[i + 1]
            matches = [lps for prompt, lps in sampled[completion] if prompt == context]
            assert matches, "a trained completion appears after a context other than its prompt"
            assert inputs["logprobs"]["data"][start:end] in matches
            assert len(set(inputs["advantages"]["data"][start:end])) == 1, "one advantage per attempt"
        untrained = [i for i, m in enumerate(mask) if not m]
        assert all(inputs["advantages"]["data"][i] == 0.0 for i in untrained)
    assert multi_turn > 0, "no datum joined several turns into one sequence"
    # The later turns extend the earlier ones: the embedded sampler served their history from its prefix
    # cache (and the tokens above are still exactly the sampled ones).
    steps = read_jsonl(tmp_path / "runs" / "exact" / "steps.jsonl")
    assert all(s["sampler/prefill_tokens"] > 0 for s in steps)
    assert all(s["sampler/prefix_cached_tokens"] > 0 for s in steps), [
        (s["sampler/prefill_tokens"], s["sampler/prefix_cached_tokens"]) for s in steps
    ]
