"""Make a model the loops_nb cache built (the dequantised offline default, a built test model) loadable by
its Hub id, offline, through the standard Hugging Face cache.

The SDK loads its tokenizer with `AutoTokenizer.from_pretrained(<hub id>)`, so the cached directory gets a
snapshot in the HF cache (symlinks, revision `model_store.ALIAS_REVISION`) that `refs/main` points at. A
model the HF cache already holds for real is never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from loops_nb.local.model_store import ALIAS_REVISION, ResolvedModel, atomic_dir, file_lock

logger = logging.getLogger(__name__)

# Optional files transformers probes for. Recorded as absent (HF's `.no_exist` cache) so that a load with the
# Hub unreachable but HF_HUB_OFFLINE unset doesn't retry each one for ~20 s before giving up.
# fmt: off
_PROBED_FILES = (
    "tokenizer.model", "added_tokens.json", "special_tokens_map.json", "adapter_config.json",
    "chat_template.json", "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
    "pytorch_model.bin", "pytorch_model.bin.index.json", "model.safetensors.index.json", "vocab.json",
    "merges.txt", "custom_generate/generate.py",
)
# fmt: on


def ensure_hf_cache_alias(resolved: ResolvedModel, *, hub_cache: Path | None = None) -> None:
    """Make `from_pretrained(resolved.model_id)` find `resolved.path` offline, via the standard HF cache.

    Writes `models--<org>--<name>/snapshots/loops-nb-offline/` (symlinks into `resolved.path`) and points
    `refs/main` at it. A repo whose `refs/main` names a real commit is left alone.
    """
    if not resolved.source.startswith(("gguf:", "built:")):
        return  # already in the HF cache, or a directory that from_pretrained loads by path
    from huggingface_hub import constants

    hub = Path(hub_cache or constants.HF_HUB_CACHE)
    repo = hub / f"models--{resolved.model_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    snapshot = repo / "snapshots" / ALIAS_REVISION
    with file_lock(hub / ".locks" / repo.name / "loops_nb_alias.lock"):
        if ref.is_file() and ref.read_text().strip() != ALIAS_REVISION:
            logger.info("%s already has a real snapshot in %s; not aliasing", resolved.model_id, repo)
            return
        files = sorted(p for p in resolved.path.iterdir() if p.is_file())
        if ref.is_file() and all((snapshot / f.name).resolve() == f.resolve() for f in files):
            return
        for stale in (repo / "snapshots").glob(".loops-nb-*"):  # debris of a crashed call (`atomic_dir`s)
            shutil.rmtree(stale, ignore_errors=True)
        with atomic_dir(snapshot) as build:
            build.chmod(0o755)
            for f in files:
                try:
                    (build / f.name).symlink_to(f.resolve())
                except OSError:  # filesystems without symlinks
                    shutil.copy2(f, build / f.name)
        for name in set(_PROBED_FILES) - {f.name for f in files}:
            absent = repo / ".no_exist" / ALIAS_REVISION / name
            absent.parent.mkdir(parents=True, exist_ok=True)
            absent.touch()
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp_ref = ref.parent / ".main.tmp"
        tmp_ref.write_text(ALIAS_REVISION)
        os.replace(tmp_ref, ref)
    logger.info("aliased %s in the HF cache at %s", resolved.model_id, snapshot)
