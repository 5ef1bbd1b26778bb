"""Configs, fuzzed: any JSON a user could write, and any override, either loads or fails with a
`ConfigError` that names the file (or the override) — never another exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loops_nb import load
from loops_nb.errors import UserError

SECTIONS = ["model", "compute", "runtime", "sampling", "training", "output", "providers", "data", "recipe"]
KEYS = [
    "base_model",
    "lora_rank",
    "scope",
    "factory",
    "options",
    "max_steps",
    "temperature",
    "output_dir",
    "run_name",
    "type",
    "local",
    "train",
    "loss",
    "mode",
    "max_seq_len",
    "chat_template",
    "trace",
]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["rl", "sft", "local", "serverless", "episode:Game", "../x", "/etc"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
CONFIGS = st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=8), VALUES, max_size=6)
FUZZ = settings(max_examples=150, suppress_health_check=list(HealthCheck))


@FUZZ
@given(raw=CONFIGS)
def test_any_json_config_loads_or_fails_naming_the_file(
    raw: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "train.json"
    path.write_text(json.dumps(raw))
    try:
        load(path)
    except UserError as exc:
        assert "train.json" in str(exc), str(exc)
        assert "\n" not in str(exc).strip() or "Traceback" not in str(exc)


@FUZZ
@given(
    key=st.lists(st.sampled_from(SECTIONS + KEYS) | st.text(max_size=5), min_size=1, max_size=3).map(
        ".".join
    ),
    value=VALUES,
)
def test_any_override_applies_or_fails_naming_the_key(key: str, value: object) -> None:
    config = (
        Path(__file__).resolve().parents[2] / "patterns/custom_runtime/in_process_direct/train_local.toml"
    )
    try:
        load(config, overrides={key: value})
    except UserError as exc:
        assert str(exc), "a refusal says why"
