"""Fixtures for the widget tests (helpers live in widget_fixtures, importable by the test modules)."""

from __future__ import annotations

from typing import Any

import pytest
from widget_fixtures import FakeDisplay, build_bytelevel_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_bytelevel_tokenizer()


@pytest.fixture
def fake_display() -> FakeDisplay:
    return FakeDisplay()
