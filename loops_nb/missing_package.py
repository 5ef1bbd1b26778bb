"""Which Python package an error says is missing, so a tokenizer or renderer that needs one says what to add.

A family's tokenizer or renderer may need a package loops_nb does not depend on: SentencePiece or protobuf for
older tokenizers, `tiktoken` for tokenizers shipped as `.tiktoken` files (Kimi K2, gpt-oss), `openai-harmony`
for gpt-oss's renderer. transformers says so in prose ("requires the SentencePiece library but it was not
found"), Python in a `ModuleNotFoundError`; either way the user should read one line naming the package.
"""

from __future__ import annotations

import re

DISTRIBUTIONS = {"google": "protobuf", "openai_harmony": "openai-harmony", "jinja": "jinja2"}
"""Import (or library) names as errors give them, and the PyPI distribution that provides each when its name
differs (sentencepiece, protobuf, tiktoken, blobfile and jinja2 are their own)."""

_PROSE = re.compile(r"requires the (\w+) library but it was not found|`(\w+)` is required to read")


def missing_package(exc: BaseException) -> str | None:
    """The PyPI name of the package `exc` says is missing, or None when it says no such thing."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        return DISTRIBUTIONS.get(top, top)
    found = _PROSE.search(" ".join(str(exc).split()))
    if found is None:
        return None
    library = (found.group(1) or found.group(2)).lower()
    return DISTRIBUTIONS.get(library, library)


def install_line(what: str, package: str) -> str:
    """`what` needs `package`: the one line to read, with the command that adds it."""
    return f"{what} needs the Python package {package!r}, which is not installed: run `uv add {package}`"
