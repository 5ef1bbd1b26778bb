"""Tiny models and tokenizers the tests build offline (no Hugging Face hub).

`build_tiny_chat_model(dir)` writes a random 2-layer Llama and a word-level tokenizer with ChatML
special tokens and a chat template: enough for the SDK, the trainer, the sampler and rendering to
run in milliseconds. Learning needs the real offline model (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "the a of to and is in it you that he was for on are with as I his they be at one have this from or "
    "had by word but what some we can out other were all there when up use your how said an each she which "
    "do their time if will way about many then them write would like so these her long make thing see him "
    "two has look more day could go come did number sound no most people my over know water than call first "
    "who may down side been now find paris france capital game chess monopoly name hidden answer "
    "user assistant system tool"
).split()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer():  # noqa: ANN201 - PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + ["\n", ":", ".", ",", "?", "!"] + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.WhitespaceSplit(),
         pre_tokenizers.Punctuation()]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHATML
    return tok


def build_tiny_chat_model(directory: Path, *, seed: int = 0) -> Path:
    """A random tiny Llama + tokenizer saved in `directory` (loadable with from_pretrained)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
