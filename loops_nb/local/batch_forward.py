"""The model forward a sampler decode batch calls (`sampler_batch.Forward`): the text one, and the one of
an image prompt's batch.

A batch calls its forward once for the prefill and once per decode step, with its KV cache. An image prompt
also needs image features and multimodal rotary positions at the prefill, then each row's position shifted
by the prefill's rotary delta; `generate` keeps that delta on the model, a batch keeps it here.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from transformers import DynamicCache

from loops_nb.local.image_chunks import VisionInputs
from loops_nb.local.kv_cache import growing_cache
from loops_nb.local.sampler_batch import Forward, Job
from loops_nb.local.shared_prompt_kv import SharedPrompts

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class BatchForward:
    """The sampler model's forward in the shape a `DecodeBatch` calls it, and a fresh cache for a batch."""

    def __init__(self, model: PreTrainedModel, vision: VisionInputs | None, device: torch.device) -> None:
        self.model = model
        self.vision = vision
        self.device = device
        # transformers 5 calls the cache argument `cache`; 4.x called it `past_key_values`.
        parameters = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"

    def new_cache(self) -> DynamicCache:
        return growing_cache(self.model.config)

    def text(
        self,
        ids: Tensor,
        mask: Tensor,
        positions: Tensor,
        cache: DynamicCache,
        every: bool,
        prompts: SharedPrompts | None,
    ) -> Tensor:
        shared = {} if prompts is None else {"shared_prompts": prompts}  # to `shared_prompt_kv`'s attention
        return self._logits({"input_ids": ids, "position_ids": positions, **shared}, mask, cache, every)

    def _logits(self, inputs: Mapping[str, Any], mask: Tensor, cache: DynamicCache, every: bool) -> Tensor:
        """Logits at every position (`every`, for prompt logprobs) or at the last one only."""
        kept = 0 if every else 1
        return self.model(
            attention_mask=mask, use_cache=True, logits_to_keep=kept, **inputs, **{self._cache_kwarg: cache}
        ).logits

    def image_prompt(self, job: Job) -> Forward:
        """The forward of an image prompt's batch (`job` decodes alone: one prompt, its `n` rows)."""
        assert self.vision is not None and job.pixels is not None
        vision, pixels = self.vision, job.pixels
        marked = torch.tensor([job.request.prompt], dtype=torch.long, device=self.device)
        delta: dict[str, Tensor] = {}

        def forward(
            ids: Tensor, mask: Tensor, positions: Tensor, cache: DynamicCache, every: bool, _: object
        ) -> Tensor:
            inputs: dict[str, Any] = {"input_ids": ids, "position_ids": positions}
            if cache.get_seq_length() == 0:  # the prefill: one row, the job's prompt (unpadded)
                inputs = vision.inputs(marked, mask, pixels)
                if "rope_deltas" in inputs:
                    delta["value"] = inputs.pop("rope_deltas").to(positions.device)
                inputs.setdefault("position_ids", positions)
            elif "value" in delta:
                inputs["position_ids"] = (positions + delta["value"])[None].expand(3, -1, -1)
            return self._logits(inputs, mask, cache, every)

        return forward
