"""The optimizer settings both recipes' `[training]` sections share, and the SDK's `AdamParams` from them.

Each recipe's training section inherits `OptimizerSettings`, so the Adam fields, their bounds and their
docs are declared once. The learning rate, the checkpoint cadence and the seed stay with each recipe,
whose defaults and meanings differ (RL updates a policy by small steps, SFT follows a schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from loops_nb.config.sections import Section

if TYPE_CHECKING:
    from baseten.loops import AdamParams


class OptimizerSettings(Section):
    beta1: float = Field(0.9, ge=0, lt=1)
    """Adam beta1."""
    beta2: float = Field(0.95, ge=0, lt=1)
    """Adam beta2."""
    eps: float = Field(1e-8, gt=0)
    """Adam epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    grad_clip_norm: float = Field(1.0, ge=0)
    """Clip the gradient norm to this (0 disables)."""

    def adam_params(self, learning_rate: float) -> AdamParams:
        """The SDK's `AdamParams` for one `optim_step` at ``learning_rate`` (a schedule's step, or the peak)."""
        from baseten.loops import AdamParams

        return AdamParams(
            learning_rate=learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )
