"""`process_memory`: the resident memory of this process and its children, as the per-step `memory/*` metrics.

Memory was what stopped real runs (kernels and `loops serve` OOM-killed), so both recipes log it with every
step, beside the timings: ``memory/rss_gb`` is the summed resident memory of this process and every process it
started (an embedded Loops runs in this process; agent programs and sandboxes are children), and
``memory/peak_gb`` this process's own high-water mark (``VmHWM``; the kernel keeps no peak for a tree). Read
from ``/proc`` without psutil; elsewhere (macOS) only the own peak, from ``getrusage``, is known.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

_GB = 1e9
_PROC = Path("/proc")


def process_memory() -> dict[str, float]:
    """``memory/rss_gb`` (this process tree, now) and ``memory/peak_gb`` (this process, ever), in GB."""
    own = _status_kb(os.getpid())
    if own is None:  # no /proc: the peak is all the kernel tells
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is bytes on macOS and KiB on Linux
        return {"memory/peak_gb": round(peak / _GB if sys.platform == "darwin" else peak * 1024 / _GB, 3)}
    rss_kb = own[0] + sum(status[0] for pid in _descendants(os.getpid()) if (status := _status_kb(pid)))
    return {"memory/rss_gb": round(rss_kb * 1024 / _GB, 3), "memory/peak_gb": round(own[1] * 1024 / _GB, 3)}


def _status_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in KiB; None when it is gone or there is no /proc."""
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])
    except (KeyError, ValueError, IndexError):  # a zombie has no Vm* lines
        return None


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``, from each process's parent in /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces: the parent follows the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
