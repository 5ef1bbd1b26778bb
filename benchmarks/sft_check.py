"""SFT check: rows/s rendered and masked by `loops check`'s report on a 10k-row tool-use dataset,
and its peak memory at 1k and 10k rows (it must stream: memory flat as rows grow). Aim: >= 1,000
rows/s on one core.

Deliberate simplifications: synthetic rows of one shape (system, tools, user, tool call, tool result,
answer), the real SmolLM2 tokenizer with the `chatml-tools` template, peak RSS of a child process.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.common import MODEL, Result

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def row(i: int) -> dict:
    city = f"City{i % 97}"
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"What's the weather in {city} today? Request {i}."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "content": json.dumps({"temp_c": i % 35, "sky": "clear"}),
            },
            {"role": "assistant", "content": f"It is {i % 35} degrees and clear in {city}."},
        ],
    }


def write(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps(row(i)) + "\n")
    return path


def _measure(path: str, out) -> None:
    import torch

    torch.set_num_threads(1)
    from loops_nb.local.model_store import load_tokenizer
    from loops_nb.model_renderer import BUILTIN_TEMPLATES
    from loops_nb.sft.report import CheckReport
    from loops_nb.sft.targets import chat_targets

    renderer = chat_targets(
        load_tokenizer(MODEL), chat_template=BUILTIN_TEMPLATES["chatml-tools"], max_seq_len=2048
    )
    started = time.process_time()
    report = CheckReport.from_file(path, renderer, batch_tokens=8192)
    cpu = time.process_time() - started
    out.put((report.rows_read, report.rows_trained, cpu, peak_rss_mb()))


def peak_rss_mb() -> float:
    """This process's own peak RSS. Not `ru_maxrss`: Linux keeps it across fork and exec, so a child of a
    parent that once held a model would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: Path) -> tuple[int, int, float, float]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(str(path), queue))
    proc.start()
    result = queue.get(timeout=1800)
    proc.join()
    return result


def run() -> list[Result]:
    with tempfile.TemporaryDirectory() as tmp:
        small = measure(write(Path(tmp) / "1k.jsonl", 1_000))
        large = measure(write(Path(tmp) / "10k.jsonl", 10_000))
    rows, trained, cpu, peak_mb = large
    assert trained == rows, f"{rows - trained} synthetic rows were refused"
    return [
        Result("sft check rows/s (1 core, CPU time)", rows / cpu, 1000.0, "rows/s", ">= 1.0 (vs 1,000)"),
        Result(
            "sft check peak RSS, 10k vs 1k rows",
            peak_mb,
            small[3],
            "MB",
            "~1.0 (flat)",
            higher_is_better=False,
        ),
    ]
