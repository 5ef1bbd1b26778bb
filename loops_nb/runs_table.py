"""Runs read back from their directories: what `loops runs` prints and the compare widget overlays.

Everything comes from the files a run writes (run.json, steps.jsonl, checkpoints.jsonl, run.log and the run
lock), so a finished, stopped, failed or live run reads the same way and nothing needs a Loops connection.
How to use it, and what each column and status means: docs/reference/after_training.md.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from loops_nb.config_drift import flatten
from loops_nb.errors import UserError
from loops_nb.run_dir import Checkpoint, RunDirectory, RunJson
from loops_nb.run_events import StepRecord

COUNT_SUFFIXES = ("/examples", "/tokens", "/attempts", "/count", "/tasks", "/discarded", "_std", "/std")
"""`eval/*` keys that count things (or give a spread) rather than measure the policy: not curves."""
NOT_MEASURES = ("/discarded/", "policy_version", "tokens_sampled")
IGNORED_CONFIG_PREFIXES = ("output.",)
"""Config keys that differ between any two runs by construction (the run's name and folder)."""
EVAL_PREFERENCE = ("eval/reward_mean", "eval/loss")
"""Which eval metric the table shows when a run logs several (else the first `eval/*` measure)."""


def is_eval_measure(key: str) -> bool:
    return (
        key.startswith("eval/")
        and not key.endswith(COUNT_SUFFIXES)
        and not any(m in key for m in NOT_MEASURES)
    )


RunRow = TypedDict(
    "RunRow",
    {
        "name": str,
        "recipe": str,
        "model": str,
        "steps": str,
        "status": str,
        "last reward": float | None,
        "last loss": float | None,
        "eval": float | None,
        "eval metric": str | None,
        "wall": float | None,
        "path": str,
    },
)
"""A row of the runs table (`loops runs`, `Runs.to_dataframe`)."""


@dataclass
class RunSummary:
    """One run directory, read from its files."""

    path: Path
    run_json: RunJson
    records: list[StepRecord]
    checkpoint: Checkpoint | None
    status: str
    config: dict[str, object] = field(default_factory=dict)
    """The run's config as run.json saved it, flattened to dotted keys."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recipe(self) -> str:
        return str(self.run_json.get("recipe") or self.config.get("recipe") or "?")

    @property
    def model(self) -> str:
        return str(self.run_json.get("model") or self.config.get("model.base_model") or "?")

    @property
    def steps(self) -> int:
        """Steps logged (a step's line is written after it trained)."""
        return self.records[-1].step + 1 if self.records else 0

    @property
    def total_steps(self) -> int | None:
        """The steps the run planned: SFT's plan (run.json), else ``training.max_steps``."""
        data = self.run_json.get("data")
        planned = data.get("total_steps") if isinstance(data, Mapping) else None
        if planned is None:
            planned = self.config.get("training.max_steps")
        return int(planned) if isinstance(planned, int) else None

    def last(self, key: str) -> float | None:
        """The last number logged as ``key``."""
        return next((v for r in reversed(self.records) if (v := r.number(key)) is not None), None)

    def metric_keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for record in self.records:
            for key in record.metrics:
                seen.setdefault(key, None)
        return list(seen)

    @property
    def eval_key(self) -> str | None:
        keys = [k for k in self.metric_keys() if is_eval_measure(k)]
        return next((k for k in EVAL_PREFERENCE if k in keys), keys[0] if keys else None)

    @property
    def wall_seconds(self) -> float | None:
        """From the first attempt's start to the last step logged (a resumed run counts the pause too); for
        steps logged without a time (RL), to the last write of steps.jsonl or checkpoints.jsonl."""
        started = self.run_json.get("started")
        if not isinstance(started, int | float) or not self.records:
            return None
        end = self.records[-1].time
        if end is None:
            logs = [self.path / "steps.jsonl", self.path / "checkpoints.jsonl"]
            end = max(p.stat().st_mtime for p in logs if p.is_file())
        return max(0.0, end - float(started))

    def row(self) -> RunRow:
        """The runs table's row."""
        eval_key = self.eval_key
        total = self.total_steps
        return {
            "name": self.name,
            "recipe": self.recipe,
            "model": self.model,
            "steps": f"{self.steps}/{total}" if total else str(self.steps),
            "status": self.status,
            "last reward": self.last("reward/mean"),
            "last loss": self.last("loss"),
            "eval": self.last(eval_key) if eval_key else None,
            "eval metric": eval_key,
            "wall": self.wall_seconds,
            "path": str(self.path),
        }


def _lock_held(run_root: Path) -> bool:
    lock = run_root / "state" / "run.lock"
    if not lock.exists():
        return False
    import fcntl

    # A shared, non-blocking flock fails only while a run holds its exclusive one; it never writes the file.
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock
    return False


def _last_event_failed(run_root: Path) -> bool:
    log = run_root / "run.log"
    if not log.is_file():
        return False
    failed = False
    with log.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("failed: "):
                failed = True
            elif line.startswith("Config: ") or " is already complete: " in line:
                failed = False  # a later attempt started (or found the run done)
    return failed


def read_run(path: str | os.PathLike[str]) -> RunSummary:
    """One run directory; a UserError when it is not one."""
    run_dir = RunDirectory.existing(path)
    root = run_dir.root
    if not _is_run(root):
        raise UserError(f"{root}: not a run directory (no run.json or steps.jsonl)")
    run_json = run_dir.read_run_json() or {}
    try:
        records = [StepRecord.from_json(line) for line in run_dir.steps.records()]
    except (ValueError, KeyError) as exc:
        raise UserError(f"{root / 'steps.jsonl'}: a line is not a step record ({exc})") from None
    config = run_json.get("config")
    flat = flatten(config) if isinstance(config, Mapping) else {}
    checkpoint = run_dir.last_checkpoint()
    summary = RunSummary(root, run_json, records, checkpoint, "incomplete", flat)
    summary.status = _status(summary)
    return summary


def _status(run: RunSummary) -> str:
    if _lock_held(run.path):
        return "running"
    if _last_event_failed(run.path):  # a fault, or a run that reached its end and trained nothing
        return "failed"
    checkpoint = run.checkpoint
    if checkpoint is not None and checkpoint.sampler_path and checkpoint.step >= run.steps:
        total = run.total_steps
        return "stopped" if total is not None and checkpoint.step < total else "completed"
    return "incomplete"


def run_paths(patterns: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The run directories ``patterns`` name: a run directory, a glob (``runs/*``), or a folder of runs."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        text = os.fspath(pattern)
        matches = sorted(glob.glob(os.path.expanduser(text))) if glob.has_magic(text) else [text]
        if not matches:
            raise UserError(f"{text}: matches no run directory")
        for match in matches:
            path = Path(match)
            if _is_run(path):
                found.setdefault(path, None)
            elif path.is_dir() and not glob.has_magic(text):
                inner = sorted(p for p in path.iterdir() if _is_run(p))
                if not inner:
                    raise UserError(f"{path}: neither a run directory nor a folder of run directories")
                for p in inner:
                    found.setdefault(p, None)
            elif not glob.has_magic(text):
                raise UserError(f"{path}: no such run directory")
    return list(found)


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / "run.json").is_file() or (path / "steps.jsonl").is_file())


class Runs(list[RunSummary]):
    """Several runs, in the order they were named."""

    def differences(self) -> dict[str, list[object]]:
        """Config key -> each run's value, for the keys whose values are not all the same."""
        keys: dict[str, None] = {}
        for run in self:
            for key in run.config:
                if not key.startswith(IGNORED_CONFIG_PREFIXES):
                    keys.setdefault(key, None)
        out = {}
        for key in keys:
            values = [run.config.get(key) for run in self]
            if any(json.dumps(v, default=str) != json.dumps(values[0], default=str) for v in values):
                out[key] = values
        return out

    def labels(self, *, max_keys: int = 3) -> list[str]:
        """A legend entry per run: what sets it apart (``learning_rate=0.02``), else its name."""
        diffs = self.differences()
        names = [r.name for r in self]
        if not diffs or len(self) < 2:
            return names
        # Keys whose shown values are all alike (data files of the same name in different folders) say nothing.
        shown = {k: [_value(v) for v in vs] for k, vs in diffs.items()}
        shown = {k: vs for k, vs in shown.items() if len(set(vs)) > 1} or shown
        short = _short_keys(list(shown))
        labels = []
        for i in range(len(self)):
            parts = [f"{short[k]}={v[i]}" for k, v in list(shown.items())[:max_keys]]
            labels.append(", ".join(parts))
        # Two runs with the same differing values (a repeated seed-less run): their names tell them apart.
        if len(set(labels)) < len(labels):
            labels = [f"{n} ({label})" for n, label in zip(names, labels, strict=True)]
        return labels

    def rows(self) -> list[RunRow]:
        return [run.row() for run in self]

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows()).set_index("name")

    def columns(self) -> dict[str, list[str]]:
        """The runs table as text, column by column (a value per run): what `describe` prints and the compare
        widget shows."""
        rows = self.rows()
        return {
            "name": [r["name"] for r in rows],
            "recipe": [r["recipe"] for r in rows],
            "model": [r["model"] for r in rows],
            "steps": [r["steps"] for r in rows],
            "status": [r["status"] for r in rows],
            "last reward": [_num(r["last reward"]) for r in rows],
            "eval": [
                "-"
                if r["eval"] is None
                else f"{_num(r['eval'])} ({str(r['eval metric']).removeprefix('eval/')})"
                for r in rows
            ],
            "wall": [duration(r["wall"]) for r in rows],
        }

    def describe(self) -> list[str]:
        """The runs table as text (what `loops runs` prints), then the config keys that differ."""
        columns = self.columns()
        columns["model"] = [_tail(model, 40) for model in columns["model"]]
        cells = [tuple(columns), *zip(*columns.values(), strict=True)]
        widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        diffs = self.differences()
        if diffs and len(self) > 1:
            lines.append(
                "differs: " + "; ".join(f"{k} {' | '.join(map(_full, vs))}" for k, vs in diffs.items())
            )
        return lines


def read_runs(patterns: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Runs:
    """The runs ``patterns`` name (a path or glob, or several), read from their directories."""
    if isinstance(patterns, str | os.PathLike):
        patterns = [patterns]
    paths = run_paths(patterns)
    if not paths:
        raise UserError("no run directories given")
    return Runs([read_run(p) for p in paths])


def _short_keys(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key that no other key shares (``learning_rate``)."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in keys):
                out[key] = suffix
                break
        else:
            out[key] = key
    return out


def _full(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


def _value(value: object) -> str:
    """`_full`, a path shown by its last part."""
    return value.rsplit("/", 1)[-1] if isinstance(value, str) else _full(value)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _tail(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
