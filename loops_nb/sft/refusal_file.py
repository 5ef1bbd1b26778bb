"""`loops check --refusals FILE`: every refused row, one JSONL record each, written while the rows stream.

The printed report lists the first refusals only; this file has all of them, training and held-out rows alike,
each as ``{"file", "row", "field", "reason", "fix"}``: ``field`` is the one the reason names first (None for a
row-level reason such as invalid JSON) and ``fix`` says what to do. Records are written as rows are rendered, so
memory stays flat however many rows a file gets wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from loops_nb.errors import UserError
from loops_nb.sft.data import RefusedRow
from loops_nb.sft.refusal_wording import refused_field, remedy


class RefusalFile:
    """A JSONL file of refusals; use as a context manager (or `close` it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.count = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--refusals {self.path}: cannot write it ({exc.strerror or exc})") from None

    def write(self, source: Path, refused: RefusedRow) -> None:
        record = {
            "file": str(source),
            "row": refused.row_number,
            "field": refused_field(refused.reason),
            "reason": refused.reason,
            "fix": remedy(refused.reason),
        }
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RefusalFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
