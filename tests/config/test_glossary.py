"""The knob glossary and `loops run --help` come from the schema."""

from __future__ import annotations

from pathlib import Path

from loops_nb.config.glossary import glossary_markdown, iter_knobs, knob_help
from loops_nb.config.schema import RECIPES

REPO = Path(__file__).resolve().parents[2]


def test_committed_glossary_is_fresh():
    committed = (REPO / "docs" / "reference" / "KNOB_GLOSSARY.md").read_text()
    assert committed == glossary_markdown(), "stale: run `uv run loops glossary --write`"


def test_every_setting_has_a_description_and_a_default():
    for model in RECIPES.values():
        for knob in iter_knobs(model):
            assert knob.description, f"{knob.key} has no docstring"
            assert knob.default, knob.key


def test_run_help_lists_settings_with_defaults():
    text = knob_help("rl")
    assert "--training.max_steps int  (default 10)" in text
    assert "--compute.scope" in text and '(default "local")' in text
