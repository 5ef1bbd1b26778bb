"""check's report: per-row outcomes, totals, histogram, steps per epoch, bounded memory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sft_fixtures import write_jsonl

from loops_nb.sft.data import read_rows
from loops_nb.sft.report import LENGTH_BINS, CheckReport
from loops_nb.sft.targets import chat_targets

USER = {"role": "user", "content": "What is the capital of France?"}
PARIS = {"role": "assistant", "content": "Paris."}
THINK = {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis."}


def dataset(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"messages": [USER, PARIS]},  # 1 trains
            {"messages": [USER, THINK, USER, THINK]},  # 2 split into 2
            "{oops",  # 3 invalid JSON
            {"messages": [{**USER, "weight": 1}, PARIS]},  # 4 weight on a user turn
            {"input_ids": [1, 2, 3], "weights": [0, 1, 1]},  # 5 tokenized
            {"messages": [USER, {"role": "assistant", "content": "x" * 3000}]},  # 6 too long
        ],
    )


def test_report_rows_and_totals(tmp_path: Path, qwen3: Any) -> None:
    renderer = chat_targets(qwen3, max_seq_len=512)
    report = CheckReport.from_file(dataset(tmp_path), renderer, batch_tokens=1, epochs=3)
    rows = report.rows
    assert list(rows.columns) == ["row_number", "status", "n_examples", "tokens", "trained_tokens", "reason"]
    assert rows["row_number"].tolist() == [1, 2, 3, 4, 5, 6]
    assert rows["status"].tolist() == ["trains", "split", "refused", "refused", "trains", "refused"]
    assert rows["n_examples"].tolist() == [1, 2, 0, 0, 1, 0]
    assert rows["reason"][0] is None
    assert "renders earlier turns differently" in rows["reason"][1]
    assert rows["reason"][2].startswith("invalid JSON")
    assert (
        rows["reason"][3] == "messages[0].weight: only assistant turns take a weight (user turns never train)"
    )
    assert "longer than max_seq_len 512" in rows["reason"][5]

    assert (report.rows_read, report.rows_trained, report.rows_split, report.rows_refused) == (6, 2, 1, 3)
    assert report.n_examples == 4 and report.split_examples == 2
    assert report.tokens == rows["tokens"].sum()
    assert report.trained_tokens == rows["trained_tokens"].sum()
    assert report.untrained_tokens == report.tokens - report.trained_tokens
    assert rows.loc[4, ["tokens", "trained_tokens"]].tolist() == [3, 2]
    assert [r for r, _ in report.refusals] == [3, 4, 6]

    examples = list(chat_targets(qwen3, max_seq_len=512).examples(read_rows(tmp_path / "d.jsonl")))
    assert sum(report.length_counts) == len(examples) == 4
    assert report.max_length == max(e.n_tokens for e in examples)
    hist = report.histogram
    assert list(hist.columns) == ["bin", "examples"] and len(hist) == len(LENGTH_BINS) + 1
    assert hist["bin"][0] == "1-128" and hist["bin"].iloc[-1] == f">{LENGTH_BINS[-1]}"

    # A step takes whole examples while they fit: one step for all, or one per example.
    assert report.steps_per_epoch == 4 and report.total_steps == 12  # batch_tokens=1: each example its own
    assert CheckReport.from_file(tmp_path / "d.jsonl", renderer, batch_tokens=10_000).steps_per_epoch == 1


def test_steps_from_batch_size_and_from_batch_tokens(tmp_path: Path, smollm2: Any) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [USER, PARIS]}] * 10)
    n = chat_targets(smollm2).render(next(read_rows(path))).examples[0].n_tokens
    by_size = CheckReport.from_file(path, chat_targets(smollm2), batch_size=4, epochs=2)
    assert (by_size.steps_per_epoch, by_size.total_steps) == (3, 6)
    by_tokens = CheckReport.from_file(path, chat_targets(smollm2), batch_tokens=3 * n)
    assert by_tokens.steps_per_epoch == math.ceil(10 / 3)
    assert CheckReport.from_file(path, chat_targets(smollm2)).steps_per_epoch is None


def test_describe_lines(tmp_path: Path, qwen3: Any) -> None:
    report = CheckReport.from_file(dataset(tmp_path), chat_targets(qwen3, max_seq_len=512), batch_size=2)
    text = "\n".join(report.describe())
    assert "rows read: 6" in text
    assert "split per turn: 1 rows into 2 examples" in text
    assert "refused: 3" in text
    assert "    row 4: messages[0].weight: only assistant turns take a weight" in text
    assert "steps: ~2 per epoch at batch_size 2; 1 epoch(s) -> ~2 steps" in text
    assert "tokens:" in text and "trained" in text


def test_samples_are_bounded_and_include_a_split_row(tmp_path: Path, qwen3: Any) -> None:
    rows = (
        [{"messages": [USER, PARIS]}] * 20
        + [{"messages": [USER, THINK, USER, THINK]}]
        + [{"messages": [USER, PARIS]}] * 20
    )
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    report = CheckReport.from_file(path, chat_targets(qwen3), n_samples=3)
    assert len(report.samples) == 3
    assert any(len(s.examples) == 2 for s in report.samples)
    assert report.rows_read == 41


def test_report_keeps_no_tokens(tmp_path: Path, smollm2: Any) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [USER, PARIS]}] * 300)
    report = CheckReport.from_file(path, chat_targets(smollm2), n_samples=2)
    # Per-row stats are a few machine integers each; tokens live only in the two samples.
    per_row = sum(
        a.itemsize for a in (report._row_numbers, report._status, report._n_examples, report._tokens)
    )
    assert per_row <= 32
    assert len(report.samples) == 2 and report.rows_read == 300
