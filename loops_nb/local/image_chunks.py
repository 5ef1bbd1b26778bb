"""Image inputs for the embedded trainer and sampler, when the local model is a vision-language model.

What is supported and how an `ImageChunk` becomes the model's inputs: docs/reference/vision_and_custom_loss.md,
"On the embedded local scope". A chunk whose `expected_tokens` differs from what the model's processor makes
of its image is refused, as Loops and Tinker refuse it. Multimodal rotary positions come from the model's own
`get_rope_index`, so the sampler can batch and cache without the model's stateful position bookkeeping.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loops_nb.local.sampling_types import IMAGE_POSITION

if TYPE_CHECKING:
    from baseten.loops import ImageChunk
    from transformers import PretrainedConfig


def is_vision_model(model_path: str | Path) -> bool:
    """Whether the model directory's config.json describes a vision-language model."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config.get("vision_config"), dict)


def load_model(model_path: str | Path, dtype: torch.dtype) -> Any:
    """The base model: `AutoModelForImageTextToText` for a vision model, else `AutoModelForCausalLM`."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cls = AutoModelForImageTextToText if is_vision_model(model_path) else AutoModelForCausalLM
    return cls.from_pretrained(str(model_path), dtype=dtype)


def max_positions(config: PretrainedConfig) -> int | None:
    for source in (config, getattr(config, "text_config", None)):
        value = getattr(source, "max_position_embeddings", None)
        if value:
            return int(value)
    return None


def decode_image_chunk(chunk: ImageChunk, where: str) -> Any:
    """The PIL image of one image chunk (RGB)."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(chunk.data))
        image.load()
    except (ValueError, OSError) as exc:
        raise ValueError(f"{where}: the image data does not decode ({exc})") from None
    return image.convert("RGB")


class VisionInputs:
    """A vision model's processor and image token, and the extra forward arguments for image prompts."""

    def __init__(self, model_path: str | Path, model: Any) -> None:
        from transformers import AutoProcessor

        self.image_processor = AutoProcessor.from_pretrained(str(model_path)).image_processor
        config = model.config
        token = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
        if token is None:
            raise ValueError(f"{model_path}: the vision model's config names no image_token_id")
        self.image_token_id = int(token)
        self.merge = int(getattr(self.image_processor, "merge_size", 1) or 1)
        self._model = model

    @classmethod
    def load(cls, model_path: str | Path, model: Any) -> VisionInputs | None:
        return cls(model_path, model) if is_vision_model(model_path) else None

    def pixels(self, chunks: Sequence[ImageChunk], where: str = "image") -> dict[str, torch.Tensor]:
        """`pixel_values` and `image_grid_thw` of image chunks, checking each `expected_tokens`."""
        images = [decode_image_chunk(c, f"{where}[{i}]") for i, c in enumerate(chunks)]
        out = self.image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]
        for i, (chunk, thw) in enumerate(zip(chunks, grid, strict=True)):
            tokens = int(thw.prod()) // (self.merge**2)
            if tokens != chunk.expected_tokens:
                raise ValueError(
                    f"{where}[{i}]: expected_tokens is {chunk.expected_tokens}, but the model's processor "
                    f"makes {tokens} image tokens of this {images[i].width}x{images[i].height} image"
                )
        return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}

    def inputs(
        self, marked: torch.Tensor, attention_mask: torch.Tensor | None, pixels: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        """`inputs_embeds` (and multimodal `position_ids`) for one cache-less forward over `marked` ids,
        whose image positions hold `IMAGE_POSITION`.

        The image features are placed at exactly those positions, not wherever the image token occurs: a
        completion that samples the image token (a random model does) stays an ordinary token.
        """
        model = self._model
        device = marked.device
        is_image = marked == IMAGE_POSITION
        ids = torch.where(is_image, torch.full_like(marked, self.image_token_id), marked)
        embeds = model.get_input_embeddings()(ids)
        grid = pixels["image_grid_thw"].to(device)
        owner = getattr(model, "model", model)
        features = owner.get_image_features(
            pixels["pixel_values"].to(device, model.dtype), image_grid_thw=grid
        )
        pooled = getattr(features, "pooler_output", features)
        flat = torch.cat(list(pooled)) if isinstance(pooled, list | tuple) else pooled
        if flat.shape[0] != int(is_image.sum()):
            raise ValueError(f"{flat.shape[0]} image features for {int(is_image.sum())} image positions")
        embeds = embeds.masked_scatter(is_image[..., None].expand_as(embeds), flat.to(embeds.dtype))
        out: dict[str, Any] = {"inputs_embeds": embeds}
        get_rope_index = getattr(owner, "get_rope_index", None)
        if get_rope_index is not None:
            positions, deltas = get_rope_index(
                ids, mm_token_type_ids=is_image.int(), image_grid_thw=grid, attention_mask=attention_mask
            )
            out["position_ids"], out["rope_deltas"] = positions, deltas
        return out
