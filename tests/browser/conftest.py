"""Fixtures for the browser tests: one JupyterLab server and one headless Chromium per module, a page per test.

Skipped, with the reason, when Chromium is absent (CI installs Debian's ``chromium`` in .ci/run). The server
serves a temporary folder holding parameterised copies of the notebooks, with the environment the rest of the
suite uses (offline hub, the shared model cache), and is killed with its kernels at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyterlab_driver import CHROMIUM, CHROMIUM_ARGS, Console, LabServer

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set LOOPS_NB_CHROMIUM)"
    )
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Screenshots, output text and console logs: $LOOPS_NB_ARTIFACTS/browser, else tests/browser/artifacts."""
    root = os.environ.get("LOOPS_NB_ARTIFACTS")
    path = Path(root) / "browser" if root else HERE / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the server serves; the tests write their notebooks here (runs/ lands here too)."""
    return tmp_path_factory.mktemp("lab-root")


@pytest.fixture(scope="module")
def lab_server(
    lab_root: Path, tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, model_cache_dir: Path
) -> Iterator[LabServer]:
    # smollm2_path: the offline model is dequantised here, once, not inside a kernel mid-test.
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        LOOPS_NB_CACHE=str(model_cache_dir),
        TQDM_DISABLE="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PYTHONUNBUFFERED="1",
    )
    server = LabServer(root=lab_root, home=tmp_path_factory.mktemp("lab-home"), env=env).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def lab_page(chromium: Any, lab_server: LabServer) -> Iterator[tuple[Any, Console]]:
    """A fresh browser context and page, with its console collected; the test's kernels stop afterwards."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    console = Console().attach(page)
    try:
        yield page, console
    finally:
        context.close()
        lab_server.shutdown_kernels()
