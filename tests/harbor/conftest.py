"""The harbor extra, required once for this folder: every module here but NEEDS_NO_HARBOR imports `harbor`.

Without the extra such a module is skipped before it is imported (so its `from harbor ...` lines need no
guard), and `-rs` lists it with the reason. Bubblewrap, which the local sandbox needs, is the `bwrap`
marker (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NEEDS_NO_HARBOR = {"test_bubblewrap.py", "test_cleanup.py", "test_verifier_toolbox.py"}
HARBOR_INSTALLED = importlib.util.find_spec("harbor") is not None
NO_HARBOR = "the harbor extra is not installed (uv sync --extra harbor)"


class WithoutHarbor(pytest.Module):
    """A module that needs the harbor extra where it is not installed: reported skipped, never imported."""


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if HARBOR_INSTALLED or module_path.name in NEEDS_NO_HARBOR:
        return None  # pytest's own Module
    return WithoutHarbor.from_parent(parent, path=module_path)


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport | None:
    # Made here rather than by a pytest.skip() in collect(), which `-rs` would place in this file.
    if isinstance(collector, WithoutHarbor):
        return pytest.CollectReport(collector.nodeid, "skipped", (str(collector.path), None, NO_HARBOR), [])
    return None
