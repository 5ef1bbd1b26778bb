"""Checks that /app/greeting.txt holds the greeting (copied to /tests and run by /tests/test.sh)."""

from pathlib import Path


def test_greeting_file_exists():
    assert Path("/app/greeting.txt").is_file()


def test_greeting_content():
    assert Path("/app/greeting.txt").read_text().strip() == "Hello, world!"
