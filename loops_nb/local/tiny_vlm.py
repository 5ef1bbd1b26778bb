"""A tiny vision-language model built from a config with random weights: `loops-nb/tiny-random-vlm`
(docs/reference/vision_and_custom_loss.md, "The tiny random test VLM").

It exists so the image path runs offline in seconds, in CI and in the vision notebook: a Qwen2-VL with a
byte-level tokenizer without merges (every byte a token, digits included) and a Qwen-style chat template that
renders image parts as `<|vision_start|><|image_pad|><|vision_end|>`. Its weights are random: it cannot learn.
`resolve_model("loops-nb/tiny-random-vlm")` builds it once into the loops_nb cache (see model_store).
"""

from __future__ import annotations

from pathlib import Path

TINY_VLM = "loops-nb/tiny-random-vlm"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]  # fmt: skip

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'image' or part.type == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type == 'text' %}{{ part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112


def build_tokenizer():
    """A byte-level BPE without merges (one token per byte) plus the Qwen-VL special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def build_tiny_vlm(out: Path, *, seed: int = 0) -> Path:
    """Write the tiny random Qwen2-VL, its tokenizer and processor to `out` (loadable offline)."""
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = build_tokenizer()
    ids = tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
    )
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    text = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
        "bos_token_id": None,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 1,
        "embed_dim": 32,
        "hidden_size": 32,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_chans": 3,
    }
    config = Qwen2VLConfig(  # type: ignore[call-arg]  # token ids are accepted as **kwargs
        text_config=text,
        vision_config=vision,
        image_token_id=ids[2],
        video_token_id=ids[3],
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tok.save_pretrained(out)
    return out
