"""Fixtures for the compatibility suite: one embedded Loops per module (tests/conftest.py's `embedded_loops`).

The suite runs third-party-style code (Tinker-style loops through the `tinker` shim, the SDK's documented
calls) against the embedded Loops exactly as it would run against Baseten: through `LOOPS_BASE_URL` and
`BASETEN_API_KEY`, with no import of loops_nb in the code under test.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def loops_env(embedded_loops, monkeypatch):
    """The environment `loops serve` prints: a script's `ServiceClient()` finds the server through it."""
    for key, value in embedded_loops.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return embedded_loops
