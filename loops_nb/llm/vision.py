"""Image inputs (the `vision` extra): reading an image part's image, and `VisionRenderer`, the chat template's
renderer for a vision-language model, which expands each image through the model's processor into its run of
image tokens (docs/reference/vision_and_custom_loss.md, "Vision" has the part shapes and the rendering).
"""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.llm.chat_messages import ChatMessage, ToolSpec, is_image_part
from loops_nb.llm.model_input import PromptImage
from loops_nb.llm.renderer import ChatRenderer, Renderer

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage
    from transformers import ProcessorMixin

    from loops_nb.llm.capture import ModelCall

URL_TIMEOUT_SECONDS = 30


_SOURCE_KEYS = ("image", "image_url", "url", "path")
"""Where an image part may hold its source, in the order they are read."""


def image_source(part: dict[str, Any]) -> Any:
    """What an image part points at: a PIL image, bytes, a path, a URL or a data URL."""
    if part.get("type") == "image_url":
        value = part.get("image_url")
        return value.get("url") if isinstance(value, dict) else value
    for key in _SOURCE_KEYS:
        if part.get(key) is not None:
            return part[key]
    raise UserError(f"an image part needs `image`, `url` or `path`: {sorted(part)}")


def with_image_source(part: dict[str, Any], source: object) -> dict[str, Any]:
    """A copy of ``part`` with ``source`` where `image_source` reads it from."""
    inner = part.get("image_url")
    if part.get("type") == "image_url" and isinstance(inner, dict):
        return {**part, "image_url": {**inner, "url": source}}
    key = (
        "image_url"
        if part.get("type") == "image_url"
        else next(k for k in _SOURCE_KEYS if part.get(k) is not None)
    )
    return {**part, key: source}


def load_image(source: object) -> PILImage:
    """A PIL image (RGB) from a PIL image, bytes, a file path, an http(s) URL or a base64 data URL."""
    from PIL import Image

    if isinstance(source, Image.Image):
        image = source
    else:
        if isinstance(source, bytes | bytearray):
            raw = bytes(source)
        elif isinstance(source, str) and source.startswith("data:"):
            header, _, payload = source.partition(",")
            if ";base64" not in header:
                raise UserError("an image data URL must be base64 (data:image/png;base64,...)")
            raw = base64.b64decode(payload)
        elif isinstance(source, str) and source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=URL_TIMEOUT_SECONDS) as response:
                raw = response.read()
        elif isinstance(source, str | Path):
            path = Path(source).expanduser()
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise UserError(f"cannot read image {path}: {exc.strerror}") from None
        else:
            raise UserError(f"unsupported image source {type(source).__name__}")
        try:
            image = Image.open(io.BytesIO(raw))
            image.load()
        except OSError as exc:
            raise UserError(f"not a readable image: {exc}") from None
    return image.convert("RGB")


def encode_png(image: PILImage) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def split_images(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages for the chat template (each image part becomes `{"type": "image"}`) and the images' sources."""
    out, sources = [], []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(is_image_part(p) for p in content):
            parts = []
            for part in content:
                if is_image_part(part):
                    sources.append(image_source(part))
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out, sources


class VisionRenderer(ChatRenderer):
    """A `ChatRenderer` for a vision-language model: image parts go through the model's processor."""

    def __init__(self, processor: ProcessorMixin, parser: Renderer | None = None) -> None:
        super().__init__(processor.tokenizer, parser=parser)
        self.processor = processor
        token = getattr(processor, "image_token_id", None)
        if token is None:
            token = self.tokenizer.convert_tokens_to_ids(getattr(processor, "image_token", "<|image_pad|>"))
            assert isinstance(token, int)  # one token converts to one id
        self.image_token_id = int(token)

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        previous: ModelCall | None = None,
    ) -> tuple[list[int], tuple[PromptImage, ...]]:
        template_messages, sources = split_images(messages)
        if not sources:
            return super().render_prompt(messages, tools, previous)
        images = [load_image(s) for s in sources]
        text = self.render_text(template_messages, tools)
        out = self.processor(text=[text], images=images, return_tensors="pt")
        ids = [int(t) for t in out["input_ids"][0]]
        spans = image_runs(ids, self.image_token_id)
        if len(spans) != len(images):
            raise UserError(
                f"the chat template placed {len(spans)} image(s) but the messages have {len(images)}: "
                "does this model's template render image parts?"
            )
        return ids, tuple(
            PromptImage(start, length, encode_png(image))
            for (start, length), image in zip(spans, images, strict=True)
        )


def image_runs(ids: Sequence[int], image_token: int) -> list[tuple[int, int]]:
    """(offset, length) of each run of `image_token` in `ids`."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate([*ids, None]):
        if t == image_token and start is None:
            start = i
        elif t != image_token and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def _plainly_text(config_file: Path) -> bool:
    """Whether a local model's config.json is plainly a text model's: every architecture a `...ForCausalLM`
    and no top-level key about images (a config class may add a vision tower the file does not name)."""
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return False
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not architectures or not all(str(a).endswith("ForCausalLM") for a in architectures):
        return False
    return not any(word in key for key in config for word in ("vision", "visual", "image", "mm_"))


def load_processor(source: str) -> Any | None:
    """The model's processor when `source` (a Hub id or a local directory) is a vision-language model."""
    if _plainly_text(Path(source).expanduser() / "config.json"):
        return None  # not worth importing and running transformers' auto classes to say so
    from transformers import AutoConfig, AutoProcessor

    try:
        config = AutoConfig.from_pretrained(source)
    except Exception:
        return None
    if getattr(config, "vision_config", None) is None:
        return None
    try:
        processor = AutoProcessor.from_pretrained(source)
    except Exception as exc:
        raise UserError(f"cannot load the processor of the vision model {source!r}: {exc}") from None
    if getattr(processor, "image_processor", None) is None:
        return None
    return processor


PREVIEW_ROWS = 5
"""Prompts `describe_prompts` lists one by one; the rest are summed up."""


def describe_prompts(
    renderer: Renderer, prompts: Sequence[tuple[str, Sequence[dict[str, Any]]]]
) -> list[str]:
    """`loops check` lines: each prompt's tokens, images and image tokens (the first few), then totals."""
    lines: list[str] = []
    totals = [0, 0, 0]
    for i, (task_id, messages) in enumerate(prompts):
        tokens, images = renderer.render_prompt(list(messages))
        image_tokens = sum(im.length for im in images)
        totals[0] += len(tokens)
        totals[1] += len(images)
        totals[2] += image_tokens
        if i < PREVIEW_ROWS:
            seen = f", {len(images)} image(s) = {image_tokens} image tokens" if images else ""
            sizes = ", ".join(f"{_size(im)}" for im in images)
            lines.append(f"  prompt {task_id}: {len(tokens)} tokens{seen}" + (f" ({sizes})" if sizes else ""))
    if prompts:
        n = len(prompts)
        lines.insert(
            0,
            f"prompts: {n} rendered, {totals[0] / n:.0f} tokens each on average"
            + (f", {totals[1]} image(s) costing {totals[2]} image tokens in all" if totals[1] else ""),
        )
    return lines


def _size(image: PromptImage) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(image.data)) as im:
        return f"{im.width}x{im.height} px -> {image.length} tokens"
