"""Helpers for the widget tests: an offline byte-level tokenizer, synthetic run events, a fake display, and the
HTML rule every renderer must keep."""

from __future__ import annotations

import re
from typing import Any

from loops_nb.run_events import AttemptFinished, ProgressTick, RunEnded, RunStarted, StepRecord

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Byte-level BPE splits rare characters into several byte tokens: the corpus keeps é, 日本 and 🙂 rare on purpose.
CORPUS = [
    "What is the capital of France? Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog. Hello world, hello again.",
    "user assistant system tool <think> answer: 42\n\tindented line\n",
] * 20


def build_bytelevel_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast` with ChatML special tokens and template, trained in-process (milliseconds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials,
        chat_template=CHATML,
    )


def assert_static_html(html: str, *, svg: bool = False) -> None:
    """The kit's HTML rule: inline styles only; nothing that an untrusted notebook strips is relied on, checked
    with JupyterLab's own sanitizer rules (`lab_sanitizer`): no tag, attribute or style declaration is lost.
    ``svg=True`` for a curve's SVG snapshot, which is for nbconvert (untrusted Lab shows its plotly JSON and drops
    the SVG): only the rules before the sanitizer's apply."""
    from lab_sanitizer import stripped

    lost = [] if svg else stripped(html)
    assert not lost, "JupyterLab's sanitizer would remove:\n" + "\n".join(sorted(set(lost)))
    lowered = html.lower()
    assert "<style" not in lowered
    assert "<script" not in lowered
    assert not re.search(r"\sdata-[a-z]", lowered), "data-* attributes are stripped in untrusted notebooks"
    assert "javascript:" not in lowered


class FakeHandle:
    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.updates = 0
        self.last: Any = None

    def update(self, obj: Any) -> None:
        self.updates += 1
        self.last = obj


class FakeDisplay:
    """Stands in for IPython's ``display(obj, display_id=True)``; records every handle it returns."""

    def __init__(self) -> None:
        self.handles: list[FakeHandle] = []

    def __call__(self, obj: Any, *, display_id: bool = True) -> FakeHandle:
        handle = FakeHandle(obj)
        self.handles.append(handle)
        return handle


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rl_step(step: int, *, reward: float = 0.5, zero_variance: float = 0.25, discarded: int = 1) -> StepRecord:
    """A step record shaped like `RLRun.train_step`'s."""
    metrics = {
        "policy_version": step + 1,
        "reward/mean": reward,
        "reward/std": 0.2,
        "reward/group_std_mean": 0.15,
        "groups/zero_variance_frac": zero_variance,
        "groups/trained": 3,
        "attempts": 16,
        "attempts/discarded": discarded,
        **({"discarded/timeout": discarded} if discarded else {}),
        "staleness/mean": 0.0,
        "tokens/sampled": 1000 + step,
        "tokens/trained": 600 + step,
        "trained": True,
        "loss": 0.1,
        "kl/sample_train_v1": 0.001,
        "entropy": 1.2,
        "time/step_s": 1.5,
    }
    return StepRecord(step, metrics)


def rl_attempt(n: int, *, reward: float = 1.0, discarded: str | None = None) -> AttemptFinished:
    """An attempt as `StepLog.attempt_finished` reports it, with its transcript."""
    return AttemptFinished(
        attempt=f"a{n}",
        task=f"task-{n % 3}",
        reward=reward,
        discarded=discarded,
        detail="timed out" if discarded else "",
        policy_versions=[1, 2],
        calls=1,
        sampled_tokens=12,
        sequence_breaks={},
        seconds=0.25,
        text={
            "attempt": f"a{n}",
            "calls": [
                {
                    "prompt": "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n",
                    "completion": f"The answer <is> {n} & 42",
                    "completion_tokens": [1, 2, 3],
                    "logprobs": [-0.1] * 3,
                    "trained": not discarded,
                    "finish_reason": "stop",
                    "tool_calls": [],
                }
            ],
        },
    )


async def fake_rl_run(observer: Any, stop: Any = None, *, steps: int = 10, attempts_per_step: int = 4) -> str:
    """Drives an observer the way `RLRun.execute` does: on_start, attempts and a record per step, a progress
    tick, on_end; checks ``stop`` at each step boundary. Returns the final status."""
    import asyncio

    observer.on_start(
        RunStarted("runs/fake", recipe="rl", model="tiny", scope="local", max_steps=steps, start_step=0)
    )
    status, step = "completed", steps
    for step in range(steps):
        if stop is not None and stop.is_set():
            status = "stopped"
            break
        for a in range(attempts_per_step):
            observer.on_attempt(rl_attempt(step * attempts_per_step + a, reward=a / attempts_per_step))
        observer.on_step(rl_step(step, reward=0.2 + 0.05 * step))
        observer.on_progress(ProgressTick((step + 1) * attempts_per_step, in_flight=2, policy_version=step))
        await asyncio.sleep(0.01)
    else:
        step = steps
    observer.on_end(RunEnded(status, step, 1.0))
    return status


def sft_events(observer: Any, steps: int = 6) -> None:
    observer.on_start(
        RunStarted("runs/sft", recipe="sft", model="tiny", scope="local", max_steps=steps, start_step=0)
    )
    for step in range(steps):
        record = {
            "loss": 2.0 - 0.2 * step,
            "learning_rate": 1e-4,
            "tokens/trained": 100,
            "tokens/total": 400,
            "epoch": step / steps,
        }
        if step % 2 == 1:
            record["eval/loss"] = 2.1 - 0.15 * step
        observer.on_step(StepRecord(step, record))
    observer.on_end(RunEnded("completed", steps, 2.0))
