"""Refresh the durations table in tests/README.md: the suite's wall time and its 20 slowest tests.

    uv run --all-extras python tests/durations.py                       # runs the whole suite (about 30 min)
    uv run --all-extras python tests/durations.py --report junit.xml    # from a run you already made with
                                                                        # pytest --junitxml=junit.xml

A test's time is pytest's JUnit "total" (set-up, call and tear-down): a module's first test carries the
module-scoped fixtures it starts (an embedded Loops, a trained run), which is where the time really goes.
The table is written between the two marker comments in tests/README.md, atomically. Deliberate
simplification: one run on whatever machine you have; CI's machine is the one the aims are about (2 cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "tests" / "README.md"
BEGIN = "<!-- durations:begin (tests/durations.py writes this table) -->"
END = "<!-- durations:end -->"
SLOWEST = 20


@dataclass(frozen=True)
class CaseTime:
    node_id: str
    seconds: float
    slow: bool


def read_report(report: Path, slow_ids: set[str]) -> list[CaseTime]:
    """Every test case in a pytest JUnit report, with its total seconds."""
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        node = "::".join([*_path_and_classes(case.get("classname", "")), case.get("name", "")])
        out.append(CaseTime(node, float(case.get("time") or 0.0), node in slow_ids))
    return out


def _path_and_classes(classname: str) -> list[str]:
    """JUnit's dotted ``tests.rl.test_faults.TestX`` as pytest's ``tests/rl/test_faults.py`` and ``TestX``."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (REPO / path).is_file():
            return [path, *parts[cut:]]
    return [classname]


def slow_node_ids() -> set[str]:
    """The node ids `-m slow` selects (marks are not in the JUnit report)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line.strip() for line in listed.splitlines() if "::" in line}


def render(times: list[CaseTime], wall_seconds: float | None, when: str) -> str:
    total = sum(t.seconds for t in times)
    quick = sum(t.seconds for t in times if not t.slow)
    lines = [
        BEGIN,
        "",
        f"Measured {when}: {len(times)} tests, {total / 60:.1f} min of test time"
        + (f" ({wall_seconds / 60:.1f} min wall)" if wall_seconds is not None else "")
        + f'; the quick tier (`-m "not slow"`) {quick / 60:.1f} min of it.',
        "",
        "| # | test | seconds | slow |",
        "|---|---|---|---|",
    ]
    ranked = sorted(times, key=lambda t: t.seconds, reverse=True)[:SLOWEST]
    for rank, t in enumerate(ranked, 1):
        lines.append(f"| {rank} | `{t.node_id}` | {t.seconds:.1f} | {'yes' if t.slow else ''} |")
    lines += ["", END]
    return "\n".join(lines)


def write_table(table: str) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the markers {BEGIN!r} and {END!r} are missing; put them back first")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    fd, tmp = tempfile.mkstemp(dir=README.parent, prefix=".README.md.")
    with os.fdopen(fd, "w") as handle:
        handle.write(head + table + tail)
    os.replace(tmp, README)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="a pytest --junitxml report to read instead of running")
    parser.add_argument("--when", default=time.strftime("%Y-%m-%d"), help="the date the table says")
    args = parser.parse_args(argv)
    wall = None
    report = args.report
    if report is None:
        report = Path(tempfile.mkdtemp()) / "junit.xml"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={report}"], cwd=REPO, check=False)
        wall = time.monotonic() - started
    if not report.is_file():
        raise SystemExit(f"{report}: no such JUnit report (pytest --junitxml=PATH writes one)")
    write_table(render(read_report(report, slow_node_ids()), wall, args.when))
    print(f"wrote the durations table to {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
