"""Session fixtures for the sampler tests: a tiny random Llama with a character-level tokenizer, an engine on it,
and the plain-transformers references the engine is checked against.

Every one of the model's 128 ids decodes to a non-empty string (single characters plus a few words), so stop
strings and completion texts are easy to reason about. `initializer_range` is raised so the random model's
next-token distributions are peaked enough for greedy decoding and seeds to matter.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from tiny_models import save_tiny_llama

VOCAB_SIZE = 128
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def build_char_tokenizer():
    """A WordLevel tokenizer over characters (padded with a few words to exactly `VOCAB_SIZE` entries)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " ")
    words = [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIALS) - len(chars))]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars + words)}
    assert len(vocab) == VOCAB_SIZE
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_sampler_model(directory: Path, *, seed: int = 0) -> Path:
    """Save a random 2-layer Llama and the character tokenizer into `directory`."""
    save_tiny_llama(
        directory,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=256,
        seed=seed,
        initializer_range=0.3,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    build_char_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session", name="sampler_model_path")
def sampler_model_path_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sampler_model(tmp_path_factory.mktemp("sampler-llama"))


@pytest.fixture(scope="session", name="plain_model")
def plain_model_fixture(sampler_model_path: Path):
    """The same weights as a plain transformers model: the reference for greedy output and logprobs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(sampler_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="session", name="engine")
def engine_fixture(sampler_model_path: Path) -> Iterator:
    from loops_nb.local.sampler import SamplerEngine

    # float32, as `plain_model`: the tests compare tokens and logprobs with it
    with SamplerEngine(sampler_model_path, device="cpu", dtype=torch.float32, max_batch_sequences=64) as eng:
        yield eng


# ------------------------------------------------------------------------------------------- references


def generate_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=EOS_ID,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def teacher_forced(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of each completion token given everything before it."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def lora_weights(plain_model, rank: int, targets: list[str], seed: int) -> tuple[dict, dict, object]:
    """A random LoRA (config dict, saved-form state dict) and a PEFT model that computes with it."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets)
    peft_model = get_peft_model(copy.deepcopy(plain_model), config).eval()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.5)
    return config.to_dict(), get_peft_model_state_dict(peft_model), peft_model
