"""Prepare a Toucan-1.5M split for SFT: download rows, convert them to OpenAI chat rows, split, write.

    python examples/sft_toucan/prepare.py                      # 2,000 rows of the SFT config from the Hub
    python examples/sft_toucan/prepare.py --rows 20000 --config Qwen3
    python examples/sft_toucan/prepare.py --offline            # the small fixture only (what is committed)

Writes ``train.jsonl``, ``eval.jsonl`` and ``prepared.json`` (source, counts, skipped rows and why) beside this
script, for ``sft_local.toml`` / ``sft.toml``.

Toucan-1.5M (``Agent-Ark/Toucan-1.5M``, Apache-2.0) stores each trajectory as strings: ``messages`` is a JSON
list whose tool use is written as separate messages, ``{"role": "tool_call", "content": "{'name': ...,
'arguments': '<json>'}"}`` (a Python-literal dict whose arguments are a JSON string) and ``{"role":
"tool_response", "name": ..., "content": ...}``; ``tools`` (``available_tools`` in the per-teacher configs) is a
JSON list of function definitions. `convert` turns that into the OpenAI chat fine-tuning rows loops_nb trains
on: consecutive ``tool_call`` messages become one assistant turn's ``tool_calls`` (joined to the assistant
message just before them, if any), each ``tool_response`` a ``tool`` message answering the calls in order.
OpenAI-style ``tool_calls``/``tool`` messages and Qwen-Agent's ``function_call``/``function`` are accepted too.

Without the Hub (no network, ``HF_HUB_OFFLINE=1``, ``--offline``), it converts the fixture in
``data/toucan_fixture/``: 32 hand-written rows in Toucan's layout, so the pipeline runs anywhere; it is not
Toucan's data. Deliberate simplifications: it reads the first rows of the first parquet shard (no sampling
across the dataset), keeps rows under ``--max-chars`` (Toucan rows with hundreds of tools run to 400k
characters), and splits by a hash of each row's uuid (stable when more rows are added).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent.parent / "data" / "toucan_fixture" / "toucan_sft_sample.jsonl"
DATASET = "Agent-Ark/Toucan-1.5M"
FIXTURE_SOURCE = (
    "the fixture data/toucan_fixture/toucan_sft_sample.jsonl (hand-written rows, not Toucan's data)"
)
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


class Skip(Exception):
    """A row that cannot be converted, and why."""


def _loads(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(value)  # Toucan writes tool calls as Python dict literals
        except (ValueError, SyntaxError):
            raise Skip(f"{what} is neither JSON nor a Python literal") from None


def _tool(definition: Any) -> dict[str, Any]:
    fn = definition.get("function", definition) if isinstance(definition, dict) else None
    if not isinstance(fn, dict) or not fn.get("name"):
        raise Skip("a tool definition has no name")
    return {"type": "function", "function": {k: fn[k] for k in _FUNCTION_KEYS if fn.get(k) is not None}}


def _call(raw: Any, call_id: str) -> dict[str, Any]:
    call = _loads(raw, "a tool call")
    if isinstance(call, dict) and "function" in call:
        call = call["function"]
    if not isinstance(call, dict) or not call.get("name"):
        raise Skip("a tool call has no name")
    arguments = _loads(call.get("arguments") or {}, "tool call arguments")
    if not isinstance(arguments, dict):
        raise Skip("tool call arguments are not an object")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments)},
    }


def convert(record: dict[str, Any]) -> dict[str, Any]:
    """One Toucan record as an OpenAI chat row ``{"messages", "tools", "metadata"}``; raises `Skip`."""
    messages = _loads(record.get("messages"), "messages")
    if not isinstance(messages, list) or not messages:
        raise Skip("no messages")
    tools = [_tool(t) for t in _loads(record.get("tools") or record.get("available_tools") or "[]", "tools")]
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # ids of calls not answered yet, in call order
    n_calls = 0

    def add_call(raw: Any) -> None:
        nonlocal n_calls
        n_calls += 1
        call = _call(raw, f"call_{n_calls}")
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not pending):
            last.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        pending.append(call["id"])

    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role in ("system", "user"):
            out.append({"role": role, "content": content or ""})
        elif role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": content or ""}
            if m.get("reasoning_content"):
                turn["reasoning_content"] = m["reasoning_content"]
            out.append(turn)
            for raw in m.get("tool_calls") or []:
                add_call(raw)
            if m.get("function_call"):
                add_call(m["function_call"])
        elif role == "tool_call":
            add_call(content)
        elif role in ("tool_response", "tool", "function"):
            if not pending:
                raise Skip("a tool response answers no call")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": text})
        else:
            raise Skip(f"unknown role {role!r}")
    for m in out:
        if m["role"] == "assistant" and not m["content"] and not m.get("tool_calls"):
            raise Skip("an empty assistant turn")
    if not any(m["role"] == "assistant" for m in out):
        raise Skip("no assistant turn")
    row: dict[str, Any] = {"messages": out}
    if tools:
        row["tools"] = tools
    row["metadata"] = {"uuid": record.get("uuid"), "subset": record.get("subset_name"), "source": DATASET}
    return row


def hub_records(config: str, limit: int) -> Iterator[dict[str, Any]]:
    """The first ``limit`` records of the config's first parquet shard, read a row group at a time."""
    import pyarrow.parquet as pq
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem()
    shards = sorted(fs.glob(f"datasets/{DATASET}/{config}/*.parquet"))
    if not shards:
        raise FileNotFoundError(f"no parquet files under {DATASET}/{config}")
    seen = 0
    for shard in shards:
        with fs.open(shard, "rb") as f:
            parquet = pq.ParquetFile(f)
            for batch in parquet.iter_batches(batch_size=256):
                for record in batch.to_pylist():
                    yield record
                    seen += 1
                    if seen >= limit:
                        return


def fixture_records() -> Iterator[dict[str, Any]]:
    with FIXTURE.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def is_eval(uuid: str, fraction: float) -> bool:
    digest = hashlib.blake2b(f"toucan-split:{uuid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000, help="records to read from the Hub")
    parser.add_argument("--config", default="SFT", help="Toucan config: SFT (default), Qwen3, Kimi-K2 or OSS")
    parser.add_argument("--eval-fraction", type=float, default=0.15)
    parser.add_argument("--max-chars", type=int, default=24000, help="skip records longer than this (JSON)")
    parser.add_argument("--offline", action="store_true", help="convert the fixture, never touch the Hub")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()

    source = f"{DATASET} ({args.config}, first {args.rows:,} records)"
    records: Iterator[dict[str, Any]]
    if args.offline or os.environ.get("HF_HUB_OFFLINE") == "1":
        source, records = FIXTURE_SOURCE, fixture_records()
    else:
        try:
            records = iter(list(hub_records(args.config, args.rows)))
        except Exception as exc:  # no network, no pyarrow, a moved file: fall back, and say why
            print(f"could not read {DATASET} from the Hub ({type(exc).__name__}: {exc}); using the fixture")
            source, records = FIXTURE_SOURCE, fixture_records()

    from loops_nb.sft.data import RefusedRow, parse_row

    train, evaluation, skipped = [], [], Counter()
    for record in records:
        if len(json.dumps(record, ensure_ascii=False)) > args.max_chars:
            skipped[f"longer than --max-chars {args.max_chars}"] += 1
            continue
        try:
            row = convert(record)
        except Skip as exc:
            skipped[str(exc)] += 1
            continue
        checked = parse_row(row)
        if isinstance(checked, RefusedRow):  # the same contract `loops check` applies
            skipped[f"refused: {checked.reason}"] += 1
            continue
        (evaluation if is_eval(str(record.get("uuid")), args.eval_fraction) else train).append(row)

    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("eval.jsonl", evaluation)):
        (args.out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    summary = {"source": source, "train": len(train), "eval": len(evaluation), "skipped": dict(skipped)}
    (args.out / "prepared.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{source}: {len(train)} train rows, {len(evaluation)} eval rows -> {args.out}")
    for reason, n in skipped.most_common(5):
        print(f"  skipped {n}: {reason}")
    if not train:
        sys.exit("no row converted; see prepared.json")


if __name__ == "__main__":
    main()
