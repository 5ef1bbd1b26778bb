"""What the local sampler accepts and returns: the `/sample` request body and the completion it answers.

`SampleRequest` mirrors the JSON body `baseten.loops.SamplingClient.sample_async` posts (protocol notes §4.1),
validated strictly so a malformed body fails with a message that names the field (the HTTP layer turns a
`pydantic.ValidationError` or a `SampleRequestError` into a 422, which the SDK does not retry). Keys the local
sampler has no use for (`return_tokens_as_token_ids`, `include_routed_experts`, `return_token_ids`, `model`,
`lora`) are ignored rather than refused, so a newer SDK that adds a key keeps working.

`SampleResult.to_wire()` builds the vLLM-shaped `/v1/completions` body that the SDK's `_parse_completions`
reads: completion-only `token_ids`, a `token_logprobs` list with no nulls, `finish_reason` in {"stop",
"length"}, and vLLM's `prompt_logprobs` layout when it was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from baseten.loops import EncodedTextChunk, ImageChunk
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Re-exported: the sampler raises this BadRequest (it names the body field at fault) from here.
from loops_nb.local.bad_request import SampleRequestError as SampleRequestError

IMAGE_POSITION = -1
"""How a parsed prompt or datum marks a position covered by an image chunk, until the model expands it."""

# vLLM's default when a request carries no max_tokens (the SDK omits it when SamplingParams.max_tokens is None).
DEFAULT_MAX_TOKENS = 16
# Upper bound on `n` for one request; a GRPO group is typically 4-64 samples.
MAX_SAMPLES_PER_REQUEST = 256
# vLLM caps both logprob counts at 20 by default (max_logprobs).
MAX_LOGPROBS = 20

FinishReason = Literal["stop", "length"]
# One prompt position of vLLM's prompt_logprobs: {str(token_id): {"logprob", "rank", "decoded_token"}}.
PromptLogprobEntry = dict[str, dict[str, Any]]


class SampleRequest(BaseModel):
    """The `/sample` body. Strict: a string where a number belongs is an error, not a coercion."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    prompt: list[int] = Field(default_factory=list)
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    structured_outputs: dict[str, object] | None = None
    model_input_chunks: list[Annotated[EncodedTextChunk | ImageChunk, Field(discriminator="type")]] | None = (
        None
    )
    """The prompt as the SDK's chunks, sent only for image prompts (`prompt` is then empty)."""

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, value: object) -> object:
        # The SDK's "off" is -1 (it only sends top_k > 0); vLLM also reads 0 as "off".
        if value in (-1, 0) and not isinstance(value, bool):
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value < -1:
            raise ValueError("must be a positive integer, or -1 (or 0) to disable top-k")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings_non_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else (value or [])
        if any(s == "" for s in strings):
            raise ValueError("stop strings must be non-empty")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids_non_negative(cls, value: list[int] | None) -> list[int] | None:
        if value and min(value) < 0:
            raise ValueError("token ids must be non-negative")
        return value

    @field_validator("structured_outputs")
    @classmethod
    def _no_structured_outputs(cls, value: dict[str, object] | None) -> None:
        if value is not None:
            raise ValueError(
                "guided decoding (structured outputs) is not supported by the local sampler; "
                "drop SamplingParams.structured_outputs or sample on Baseten"
            )
        return None

    @model_validator(mode="after")
    def _resolve_prompt(self) -> SampleRequest:
        # An image chunk stands for `expected_tokens` positions, marked IMAGE_POSITION until the engine
        # expands them.
        if self.model_input_chunks and not self.prompt:
            flat: list[int] = []
            for chunk in self.model_input_chunks:
                flat += (
                    chunk.tokens
                    if isinstance(chunk, EncodedTextChunk)
                    else [IMAGE_POSITION] * chunk.expected_tokens
                )
            object.__setattr__(self, "prompt", flat)
        if not self.prompt:
            raise ValueError("prompt: must contain at least one token id")
        if min(self.prompt) < (IMAGE_POSITION if self.images else 0):
            raise ValueError("prompt: token ids must be non-negative")
        return self

    @property
    def images(self) -> list[ImageChunk]:
        """The image chunks of the prompt, in order (empty for a text prompt)."""
        return [c for c in self.model_input_chunks or () if isinstance(c, ImageChunk)]

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple of strings (a bare string is one stop string)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


@dataclass(frozen=True)
class SampledChoice:
    """One of a request's `n` completions.

    `token_ids` are completion-only and include the stop token (EOS or a `stop_token_ids` hit) when the
    completion stopped on one; `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution it
    was sampled from, before top-k/top-p truncation (see `decoding.select_tokens`). `text` is the decoded
    completion without special tokens, cut before a matched stop string (vLLM's `include_stop_str_in_output`
    off) and without the stop token's text.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str


@dataclass(frozen=True)
class SampleResult:
    """The answer to one `SampleRequest`: `n` choices, plus what served them.

    `adapter`/`adapter_version` name the LoRA weights the whole generation ran with (None = base model), so
    the HTTP layer can set `x-trainers-policy-version` from what was actually used, not what was live when the
    request arrived. `prompt_logprobs` is vLLM's list (entry 0 None) when the request asked for it.
    """

    choices: list[SampledChoice]
    prompt_token_ids: list[int]
    adapter: str | None = None
    adapter_version: int | None = None
    prompt_logprobs: list[PromptLogprobEntry | None] | None = None
    echo_prompt: bool = False
    """Echo `prompt_token_ids` on each choice: an image prompt's expanded ids, which the SDK aligns its
    prompt logprobs with (its own request carried only chunks)."""

    def to_wire(self) -> dict[str, Any]:
        """The `/sample` 200 body, shaped like vLLM's `/v1/completions` answer with token ids."""
        choices = []
        for index, choice in enumerate(self.choices):
            wire: dict[str, Any] = {
                "index": index,
                "token_ids": list(choice.token_ids),
                "logprobs": {
                    "token_logprobs": list(choice.logprobs),
                    "tokens": [f"token_id:{t}" for t in choice.token_ids],
                },
                "finish_reason": choice.finish_reason,
                "text": choice.text,
            }
            # vLLM repeats prompt_logprobs on every choice; the SDK reads the first one it finds.
            if self.prompt_logprobs is not None:
                wire["prompt_logprobs"] = self.prompt_logprobs
            if self.echo_prompt:
                wire["prompt_token_ids"] = list(self.prompt_token_ids)
            choices.append(wire)
        return {"choices": choices}
