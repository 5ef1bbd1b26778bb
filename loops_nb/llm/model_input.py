"""`model_input`: a sequence of tokens (and the images among them) as the SDK's `ModelInput`, and `PromptImage`,
one image of a prompt. It lives here, not in vision.py, so that text-only calls never import the vision code
and capture.py can name it without importing the renderers (which import capture.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt: where its image tokens sit in the (expanded) ids, and its encoded bytes."""

    offset: int
    length: int
    data: bytes
    format: Literal["png", "jpeg"] = "png"

    def chunk(self) -> Any:
        from baseten.loops import ImageChunk

        return ImageChunk(data=self.data, format=self.format, expected_tokens=self.length)


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
