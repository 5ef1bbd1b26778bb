"""`check`'s report: what trains, what is split per turn, what is refused and why, in one streaming pass
through the `Renderer`, so it sees exactly what training will. Memory stays flat as the dataset grows: a few
integers per row, fixed histogram bins, and a bounded sample of rendered rows for previews. The report lists
the first refusals; `RefusalFile` (`loops check --refusals FILE`) writes every one as it streams
(docs/reference/sft.md#the-check-report).
"""

from __future__ import annotations

import bisect
import json
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.sft.data import RefusedRow, RowResult, read_rows
from loops_nb.sft.refusal_wording import refused_field, remedy, with_fix
from loops_nb.sft.targets import RenderedRow, SFTTargets

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("trains", "split", "refused")
# Example lengths are counted into these bins (upper edges, inclusive); the last bin is open.
LENGTH_BINS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_LISTED_REFUSALS = 10


@dataclass
class CheckReport:
    """Per-row outcomes and totals for one dataset under one tokenizer, template and ``max_seq_len``."""

    rows_read: int = 0
    n_examples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    max_length: int = 0
    batch_tokens: int | None = None
    batch_size: int | None = None
    epochs: int = 1
    steps_per_epoch: int | None = None
    source: str | None = None
    """The data file the rows came from, named where refusals are listed (None for in-memory rows)."""
    length_counts: list[int] = field(default_factory=lambda: [0] * (len(LENGTH_BINS) + 1))
    samples: list[RenderedRow] = field(default_factory=list)
    _row_numbers: array = field(default_factory=lambda: array("q"), repr=False)
    _status: array = field(default_factory=lambda: array("b"), repr=False)
    _n_examples: array = field(default_factory=lambda: array("l"), repr=False)
    _tokens: array = field(default_factory=lambda: array("q"), repr=False)
    _trained: array = field(default_factory=lambda: array("q"), repr=False)
    _reasons: dict[int, str] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        rows: Iterable[RowResult],
        renderer: SFTTargets,
        *,
        batch_tokens: int | None = None,
        batch_size: int | None = None,
        epochs: int = 1,
        n_samples: int = 3,
    ) -> CheckReport:
        """Stream ``rows`` (e.g. `read_rows(path)`) through ``renderer``; steps per epoch are estimated from
        ``batch_tokens`` or else ``batch_size`` (docs/reference/sft.md#the-check-report)."""
        report = cls(batch_tokens=batch_tokens, batch_size=batch_size, epochs=epochs)
        steps, fill = 0, 0
        for result in renderer.render_rows(rows):
            report.add(result, n_samples)
            if isinstance(result, RenderedRow) and batch_tokens:
                for example in result.examples:
                    if fill and fill + example.n_tokens > batch_tokens:
                        steps, fill = steps + 1, 0
                    fill += example.n_tokens
        if batch_tokens:
            report.steps_per_epoch = steps + (1 if fill else 0)
        elif batch_size:
            report.steps_per_epoch = math.ceil(report.n_examples / batch_size)
        return report

    @classmethod
    def from_file(cls, path: str | Path, renderer: SFTTargets, **kwargs: Any) -> CheckReport:
        """`build` over a JSONL file, read line by line."""
        report = cls.build(read_rows(path), renderer, **kwargs)
        report.source = str(path)
        return report

    def add(self, result: RenderedRow | RefusedRow, n_samples: int = 3) -> None:
        """Count one rendered row (or refusal); the first ``n_samples`` rendered rows are kept for previews."""
        reason: str | None
        if isinstance(result, RefusedRow):
            examples, reason = [], result.reason
        else:
            examples, reason = result.examples, result.split_reason
            self._keep_sample(result, len(examples) > 1, n_samples)
        if reason:
            self._reasons[len(self._status)] = reason
        tokens, trained = sum(e.n_tokens for e in examples), sum(e.n_trained for e in examples)
        self.rows_read += 1
        self._row_numbers.append(result.row_number)
        self._status.append(2 if isinstance(result, RefusedRow) else int(len(examples) > 1))
        self._n_examples.append(len(examples))
        self._tokens.append(tokens)
        self._trained.append(trained)
        self.n_examples += len(examples)
        self.tokens += tokens
        self.trained_tokens += trained
        for example in examples:
            self.max_length = max(self.max_length, example.n_tokens)
            self.length_counts[bisect.bisect_left(LENGTH_BINS, example.n_tokens)] += 1

    def _keep_sample(self, result: RenderedRow, split: bool, n_samples: int) -> None:
        # Keep the first rows, but make room for one split row: it is the case a preview most needs to show.
        if len(self.samples) < n_samples:
            self.samples.append(result)
        elif split and n_samples and not any(s.split_reason for s in self.samples):
            self.samples[-1] = result

    # -- views -------------------------------------------------------------------------------------------------

    @property
    def rows(self) -> pd.DataFrame:
        """One line per row: row_number, status (trains/split/refused), n_examples, tokens, trained_tokens,
        reason (why it was split or refused; None when it trains as one example)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "row_number": pd.array(self._row_numbers, dtype="int64"),
                "status": pd.Categorical.from_codes(list(self._status), categories=list(STATUSES)),
                "n_examples": pd.array(self._n_examples, dtype="int64"),
                "tokens": pd.array(self._tokens, dtype="int64"),
                "trained_tokens": pd.array(self._trained, dtype="int64"),
                # object dtype keeps None (not NaN) for rows that train without remark
                "reason": pd.Series([self._reasons.get(i) for i in range(len(self._status))], dtype=object),
            }
        )

    @property
    def rows_trained(self) -> int:
        """Rows that train as one example."""
        return self._status.count(0)

    @property
    def rows_split(self) -> int:
        """Rows that train, split into one example per context."""
        return self._status.count(1)

    @property
    def rows_refused(self) -> int:
        return self._status.count(2)

    @property
    def split_examples(self) -> int:
        return sum(n for n, s in zip(self._n_examples, self._status, strict=True) if s == 1)

    @property
    def untrained_tokens(self) -> int:
        return self.tokens - self.trained_tokens

    @property
    def refusals(self) -> list[tuple[int, str]]:
        """``(row_number, reason)`` of every refused row, in file order."""
        return [(self._row_numbers[i], r) for i, r in sorted(self._reasons.items()) if self._status[i] == 2]

    @property
    def total_steps(self) -> int | None:
        return None if self.steps_per_epoch is None else self.steps_per_epoch * self.epochs

    @property
    def histogram(self) -> pd.DataFrame:
        """Examples per length bin: columns ``bin`` (e.g. "257-512") and ``examples``."""
        import pandas as pd

        return pd.DataFrame({"bin": _bin_labels(), "examples": self.length_counts})

    def refusal_lines(self, what: str, *, written: str | None = None) -> list[str]:
        """``what: N`` and the first refused rows, one line each and each ending in what to do, under a line naming
        the file: a user reading ``row 12: ...`` must know which file row 12 is in, and that the other rows still
        count. ``written`` is the file `loops check --refusals` wrote every refusal to, if it did."""
        count = self.rows_refused
        if not count:
            return [f"  {what}: 0"]
        rows = " row" if count == 1 else " rows"
        of = f"{rows} of {self.source}" if self.source else rows
        lines = [f"  {what}: {count:,}{of} (the other rows are unaffected); fix or remove these:"]
        lines += [f"    row {n}: {with_fix(reason)}" for n, reason in self.refusals[:_LISTED_REFUSALS]]
        if count > _LISTED_REFUSALS:
            where = (
                f"all are in {written}" if written else "`loops check CONFIG --refusals FILE` writes them all"
            )
            lines.append(f"    ... and {count - _LISTED_REFUSALS:,} more ({where})")
        return lines

    def describe(self, *, refusals_written: str | None = None) -> list[str]:
        """Lines for a CLI print-out; ``refusals_written``: the file every refusal was written to, if any."""
        lines = [f"rows read: {self.rows_read:,}"]
        lines.append(f"  train as one example: {self.rows_trained:,}")
        if self.rows_split:
            lines.append(f"  split per turn: {self.rows_split:,} rows into {self.split_examples:,} examples")
            first = next(i for i, s in enumerate(self._status) if s == 1)
            lines.append(f"    e.g. row {self._row_numbers[first]}: {self._reasons.get(first)}")
        lines += self.refusal_lines("refused", written=refusals_written)
        share = f" ({self.trained_tokens / self.tokens:.1%})" if self.tokens else ""
        lines.append(
            f"examples: {self.n_examples:,}; tokens: {self.tokens:,}, trained {self.trained_tokens:,}{share}, "
            f"untrained {self.untrained_tokens:,}"
        )
        if self.n_examples:
            lines.append(
                f"example length: mean {self.tokens / self.n_examples:,.0f}, max {self.max_length:,}"
            )
            width = max(self.length_counts)
            for label, count in zip(_bin_labels(), self.length_counts, strict=True):
                if count:
                    bar = "#" * max(1, round(30 * count / width))
                    lines.append(f"  {label:>13} {count:>9,} {bar}")
        if self.steps_per_epoch is not None:
            per = (
                f"batch_tokens {self.batch_tokens:,}"
                if self.batch_tokens
                else f"batch_size {self.batch_size}"
            )
            lines.append(
                f"steps: ~{self.steps_per_epoch:,} per epoch at {per}; {self.epochs} epoch(s) -> "
                f"~{self.total_steps:,} steps"
            )
        return lines


class RefusalFile:
    """A JSONL file of every refusal, one ``{"file", "row", "field", "reason", "fix"}`` record each, written as
    rows are rendered; use as a context manager (or `close` it)."""

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


def _bin_labels() -> list[str]:
    lows = (1, *(e + 1 for e in LENGTH_BINS))
    return [f"{lo}-{hi}" for lo, hi in zip(lows, LENGTH_BINS, strict=False)] + [f">{LENGTH_BINS[-1]}"]
