"""One run on the embedded Loops: its LoRA trainer, its op queue and what its paired sampler serves.

A record of its own, so what acts on one run (`idle_runs`) needs the run, not the whole server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from loops_nb.local.operations import OperationQueue

if TYPE_CHECKING:
    from loops_nb.local.trainer import LoraTrainer


@dataclass
class LocalRun:
    id: str
    base_model: str
    lora_rank: int
    directory: Path
    seed: int | None = None
    name: str | None = None
    max_seq_len: int | None = None
    """The longest datum the run's trainer accepts (the SDK sends it at creation); None: the model's."""
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    trainer: LoraTrainer | None = None
    ops: OperationQueue = field(init=False)
    active: bool = True
    published_version: int = 0
    """The policy version the run's paired sampler serves (0: the base model)."""
    published_names: list[str] = field(default_factory=list)
    """Sampler weights published with bump_version, oldest first (the retention window)."""
    parked_step: int | None = None
    """Set while an idle run's trainer is on disk (see idle_runs): the step it was at."""

    def __post_init__(self) -> None:
        self.ops = OperationQueue(self.id)
