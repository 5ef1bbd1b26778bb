"""Fixtures for the compatibility suite: one embedded Loops per module, on the tiny chat model.

The suite runs third-party-style code (Tinker-style loops through the `tinker` shim, the SDK's documented
calls) against the embedded Loops exactly as it would run against Baseten: through `LOOPS_BASE_URL` and
`BASETEN_API_KEY`, with no import of loops_nb in the code under test.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def embedded_loops(tmp_path_factory, model_cache_dir):
    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(
        state_dir=tmp_path_factory.mktemp("compat-loops-state"), cache_dir=model_cache_dir, device="cpu"
    ) as server:
        yield server


@pytest.fixture
def loops_env(embedded_loops, monkeypatch):
    """The environment `loops serve` prints: a script's `ServiceClient()` finds the server through it."""
    for key, value in embedded_loops.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return embedded_loops
