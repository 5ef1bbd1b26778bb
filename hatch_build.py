"""Hatch build hook: the wheel ships patterns/, examples/ (Harbor tasks included), data/ and notebooks/.

They go under `loops_nb/_shipped/`, where `loops_nb.shipped` finds them, so `loops check examples/...` works
from any directory after `uv add loops-nb`. Only files git would commit are shipped (a user's runs/,
checkpoints, .env files and caches stay out); hatch's own `force-include` would take every file. An
editable install ships nothing: the checkout's folders are used in place.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SHIPPED_FOLDERS = ("patterns", "examples", "data", "notebooks")
NEVER = {"runs", "__pycache__", ".ipynb_checkpoints", ".env", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def shipped_files(root: Path) -> list[Path]:
    """The files of the shipped folders, relative to `root`: git's view when this is a checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *SHIPPED_FOLDERS],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0 and (root / ".git").exists():
        candidates = [Path(p) for p in listed.stdout.split("\0") if p]
    else:  # an sdist: it holds only what git would have committed
        candidates = [p.relative_to(root) for f in SHIPPED_FOLDERS for p in (root / f).rglob("*")]
    return sorted(
        p
        for p in candidates
        if (root / p).is_file() and not NEVER.intersection(p.parts) and p.suffix != ".pyc"
    )


class ShippedFolders(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        root = Path(self.root)
        for path in shipped_files(root):
            build_data["force_include"][str(root / path)] = f"loops_nb/_shipped/{path.as_posix()}"
