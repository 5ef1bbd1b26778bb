"""Trainer path: forward_backward + optim_step through the SDK and the embedded Loops, against the
same math in a plain torch/PEFT loop on the same batch and model. Aim: >= 0.9 of its tokens/s.

Deliberate simplifications: one fixed batch (8 sequences x 128 tokens, every target trained), a few
steps after a warm-up, the median step time.
"""

from __future__ import annotations

import torch

from benchmarks.common import MODEL, Result, median_time, model_path

BATCH, LENGTH, STEPS = 8, 128, 5


def batch(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab - 1, (BATCH, LENGTH + 1), generator=g).tolist()


def plain_peft(path, rows: list[list[int]]) -> float:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    model.eval()  # as the local trainer: no dropout, so trainer and sampler logprobs agree
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    ids = torch.tensor(rows)

    def step() -> None:
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        (loss / ids[:, 1:].numel()).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()

    step()
    return median_time(step, STEPS)


def through_sdk(rows: list[list[int]]) -> float:
    from baseten.loops import AdamParams, Datum, ModelInput, TensorData

    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(device="cpu" if not torch.cuda.is_available() else "auto") as loops:
        tc = loops.service_client().create_lora_training_client(base_model=MODEL, rank=16)
        data = [
            Datum(
                model_input=ModelInput.from_ints(r[:-1]),
                loss_fn_inputs={"target_tokens": TensorData(data=r[1:], dtype="int64", shape=[LENGTH])},
            )
            for r in rows
        ]

        def step() -> None:
            fb = tc.forward_backward(data, loss_fn="cross_entropy")
            tc.optim_step(AdamParams(learning_rate=1e-4)).result()
            fb.result()

        step()
        seconds = median_time(step, STEPS)
        tc.close()
    return seconds


def run() -> list[Result]:
    path = model_path()
    from transformers import AutoConfig

    rows = batch(AutoConfig.from_pretrained(path).vocab_size)
    tokens = BATCH * LENGTH
    reference = plain_peft(path, rows)
    ours = through_sdk(rows)
    return [Result("trainer fb+optim tokens/s", tokens / ours, tokens / reference, "tok/s", ">= 0.9")]
