"""The SFT recipe's config: `recipe = "sft"` with `[data]` and `[training]`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from loops_nb.config.sections import ConfigPath, RecipeConfig, Section
from loops_nb.run.optimizer import OptimizerSettings
from loops_nb.sft.schedule import Schedule, learning_rate


class SFTDataConfig(Section):
    train: ConfigPath
    """Training data: OpenAI chat fine-tuning JSONL (messages, tools, per-turn weight), or tokenized
    rows (input_ids + weights). Relative to the config."""

    eval: ConfigPath | None = None
    """Held-out data in the same format. Without it, `eval_fraction` of the training rows is held out."""

    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    """Share of training rows held out for evaluation when no eval file is given (0 disables)."""

    max_rows: int | None = Field(None, ge=1)
    """Read at most this many rows of the training file."""

    shuffle_seed: int = 0
    """Seed of the data order and of the held-out split; a resumed run reuses it."""


class SFTTrainingConfig(OptimizerSettings):
    learning_rate: float = Field(2e-4, gt=0)
    """Peak Adam learning rate."""

    lr_schedule: Schedule = "linear"
    """How the learning rate decays after warm-up: `constant`, or `linear`/`cosine` from the peak down
    towards 0, which it reaches as the last step ends (so the last step still learns a little)."""

    warmup_steps: int = Field(0, ge=0)
    """Steps of linear warm-up to the peak learning rate (step i of the warm-up uses (i+1)/warmup_steps
    of it)."""

    epochs: int = Field(1, ge=1)
    """Passes over the training data."""

    max_steps: int | None = Field(None, ge=1)
    """Stop after this many optimizer steps (before the epochs end)."""

    batch_tokens: int = Field(8192, ge=16)
    """Tokens per optimizer step: examples are packed into batches up to this many tokens."""

    eval_every: int = Field(10, ge=0)
    """Evaluate the held-out loss every this many steps (0: only at the end). It is also measured once
    before the first step, so the log shows where it started."""

    eval_max_examples: int = Field(256, ge=1)
    """Most held-out examples the held-out loss is measured on (the first ones in file order), so an
    evaluation costs a bounded number of forward passes however large the held-out set."""

    save_every: int = Field(20, ge=0)
    """Save resumable trainer state every this many steps (0: only at the end)."""

    seed: int = 0
    """Seed of the trainer's LoRA initialisation."""

    def rate(self, step: int, total_steps: int) -> float:
        """The rate of ``step`` under this schedule (what each `optim_step` is sent)."""
        return learning_rate(
            step,
            total_steps=total_steps,
            peak=self.learning_rate,
            schedule=self.lr_schedule,
            warmup_steps=self.warmup_steps,
        )

    def describe_schedule(self, total_steps: int) -> str:
        """One line: the schedule's shape and its first, peak and last rates."""
        if total_steps <= 0:
            return f"learning rate: {self.lr_schedule}, peak {self.learning_rate:.3g} (no steps)"
        warm = f"{self.warmup_steps} warm-up step(s), " if self.warmup_steps else ""
        return (
            f"learning rate: {warm}{self.lr_schedule}; step 1 {self.rate(0, total_steps):.3g}, peak "
            f"{self.learning_rate:.3g}, last step {self.rate(total_steps - 1, total_steps):.3g}"
        )


class SFTConfig(RecipeConfig):
    recipe: Literal["sft"] = "sft"
    """The recipe: `sft` trains on conversations to imitate."""

    data: SFTDataConfig
    """The conversations to train on."""

    training: SFTTrainingConfig = Field(default_factory=SFTTrainingConfig)
    """Optimisation settings."""

    @model_validator(mode="after")
    def _eval_file_or_fraction(self) -> SFTConfig:
        if self.data.eval is not None and "eval_fraction" in self.data.model_fields_set:
            raise ValueError("data.eval and data.eval_fraction: give a held-out file or a fraction, not both")
        return self
