"""`model_input`: a sequence of tokens (and the images among them) as the SDK's `ModelInput`.

Text-only calls, the common case, never import the vision code: an image travels as the `PromptImage` the
vision renderer made, which knows its own chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.llm.vision import PromptImage


def model_input(tokens: Sequence[int], images: Sequence[PromptImage] = ()) -> Any:
    """`ModelInput` of expanded `tokens`: text chunks, and an `ImageChunk` in place of each image's run."""
    from baseten.loops import EncodedTextChunk, ModelInput

    if not images:
        return ModelInput.from_ints(list(tokens))
    chunks: list[Any] = []
    at = 0
    for image in sorted(images, key=lambda im: im.offset):
        if image.offset + image.length > len(tokens):
            raise ValueError(
                f"an image at {image.offset} (+{image.length}) lies past the {len(tokens)} tokens"
            )
        if image.offset > at:
            chunks.append(EncodedTextChunk(tokens=list(tokens[at : image.offset])))
        chunks.append(image.chunk())
        at = image.offset + image.length
    if at < len(tokens):
        chunks.append(EncodedTextChunk(tokens=list(tokens[at:])))
    return ModelInput(chunks=chunks)
