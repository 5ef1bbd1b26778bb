"""Where the patterns, examples, data and notebooks that ship with loops_nb live.

In a clone they are the repository's top-level folders; in an installed wheel they are packaged under
`loops_nb/_shipped/`. A config path that does not exist in the working directory resolves here, so
`loops check examples/sft_tool_use/sft.toml` works from any directory.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_FOLDERS = ("patterns", "examples", "data", "notebooks")


def shipped_root() -> Path | None:
    """The folder holding the shipped patterns/examples, or None when neither layout is present."""
    package = Path(__file__).resolve().parent
    bundled = package / "_shipped"
    if bundled.is_dir():
        return bundled
    checkout = package.parent
    if any((checkout / name).is_dir() for name in SHIPPED_FOLDERS):
        return checkout
    return None


def find_shipped(relative: Path) -> Path | None:
    """The shipped copy of `relative`, if there is one."""
    root = shipped_root()
    if root is None or relative.is_absolute():
        return None
    candidate = root / relative
    return candidate if candidate.exists() else None
