"""run_dir.JsonlLog: whole lines only, including after a resumed run rewinds a log that drops nothing."""

from __future__ import annotations

import json
from pathlib import Path

from loops_nb.run_dir import JsonlLog


def test_rewinding_a_log_cuts_a_torn_tail_even_when_no_record_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints.jsonl"
    path.write_text('{"step": 2}\n{"step": 4}\n{"step": 99, "torn')
    log = JsonlLog(path)
    assert log.keep(lambda r: r["step"] <= 4) == 0
    assert path.read_text() == '{"step": 2}\n{"step": 4}\n'
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 2}, {"step": 4}]


def test_a_torn_tail_is_cut_before_the_first_append_and_never_read(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "lo')
    log = JsonlLog(path)
    assert list(log.records()) == [{"step": 0}]
    assert path.read_text().endswith('"lo'), "opening or reading a log never rewrites it"
    log.append({"step": 1})
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
