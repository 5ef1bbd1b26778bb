"""The resource journal survives a crash mid-write: a cut last line never swallows the next event."""

from __future__ import annotations

from pathlib import Path

from loops_nb.resources import ResourceJournal


def test_an_event_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    first = ResourceJournal(path)
    sandbox = first.intent("local", "sandbox", name="a")
    first.created(sandbox, "/tmp/a")
    with path.open("ab") as f:  # what a SIGKILL in the middle of the next write leaves
        f.write(b'{"event": "released", "key": "' + sandbox.key.encode())

    after = ResourceJournal(tmp_path / "journal.jsonl")  # the next process, e.g. `loops cleanup`
    other = after.intent("local", "sandbox", name="b")
    after.created(other, "/tmp/b")

    entries = {e.key: e for e in after.entries()}
    assert entries[sandbox.key].status == "created", "the torn release did not happen: still live"
    assert entries[other.key].status == "created" and entries[other.key].provider_id == "/tmp/b"
    assert path.read_bytes().endswith(b"\n")
