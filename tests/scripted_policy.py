"""A policy whose sampler returns scripted completions: the tool-call replies a random tiny model would
never write. `LoopsLLM` samples from it as from the real sampling client and gets the texts back as
tokens, so the real parsing and token capture run on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loops_nb.llm.renderer import Renderer


@dataclass
class ScriptedSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


@dataclass
class ScriptedResponse:
    sequences: list[ScriptedSequence]
    policy_version: int = 0


class ScriptedPolicy:
    """Answers each sample with the next of `texts`, tokenized, every token at `logprob`.

    `end_token`: appended to each completion, as a sampler that keeps the stop token does; without it
    the completion ends as the local sampler returns it, stop token dropped. Prompts are kept in `prompts`.
    """

    version = 0

    def __init__(
        self,
        renderer: Renderer,
        texts: list[str],
        *,
        logprob: float = -0.25,
        end_token: int | None = None,
    ) -> None:
        self.renderer, self.texts = renderer, list(texts)
        self.logprob, self.end_token = logprob, end_token
        self.prompts: list[list[int]] = []

    @property
    def sampling_client(self) -> ScriptedPolicy:
        return self

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> ScriptedResponse:
        self.prompts.append(prompt_ids(prompt))
        tokens = self.renderer.encode(self.texts.pop(0))
        if self.end_token is not None:
            tokens.append(self.end_token)
        return ScriptedResponse(
            [ScriptedSequence(tokens, [self.logprob] * len(tokens), "stop")] * num_samples
        )


IMAGE_POSITION = -1
"""What `prompt_ids` puts at an image chunk's positions."""


def prompt_ids(prompt: Any) -> list[int]:
    """A `ModelInput`'s token ids, each image chunk as `expected_tokens` times `IMAGE_POSITION`."""
    return [
        t
        for chunk in prompt.chunks
        for t in (chunk.tokens if hasattr(chunk, "tokens") else [IMAGE_POSITION] * chunk.expected_tokens)
    ]
