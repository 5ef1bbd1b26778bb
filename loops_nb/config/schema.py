"""The whole config: the `recipe` key picks the RL or the SFT model."""

from __future__ import annotations

from loops_nb.rl.config import RLConfig
from loops_nb.sft.config import SFTConfig

AnyConfig = RLConfig | SFTConfig

RECIPES: dict[str, type[RLConfig] | type[SFTConfig]] = {"rl": RLConfig, "sft": SFTConfig}
"""Recipe name -> its config model."""
