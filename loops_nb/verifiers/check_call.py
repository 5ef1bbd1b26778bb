"""`loops check` for a verifiers environment: its tasks and rubric, and one episode played through the gateway,
each model call answered with `CHECK_REPLY` as the check has no trainer (docs/reference/verifiers.md,
"`loops check`").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.model_access.gateway import ModelGateway
from loops_nb.model_access.leased_runtime import LeasedRuntime
from loops_nb.runtime import Attempt, AttemptServices, RolloutRuntime
from loops_nb.verifiers.listing import EnvironmentListing

if TYPE_CHECKING:
    from baseten.loops import ModelInput, SamplingParams

    from loops_nb.llm.renderer import Renderer

CHECK_REPLY = "loops check"
"""What every model call of the check's episode is answered with."""


@dataclass
class _Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str = "stop"


@dataclass
class _Response:
    sequences: list[_Sequence]
    policy_version: int = 0


class FixedReplyPolicy:
    """A policy source whose sampler answers every prompt with `text` (the check's stand-in for the model)."""

    version = 0

    def __init__(self, renderer: Renderer, text: str = CHECK_REPLY) -> None:
        self.tokens = renderer.encode(text)
        self.prompts: list[list[int]] = []

    @property
    def sampling_client(self) -> FixedReplyPolicy:
        return self

    async def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> _Response:
        self.prompts.append(list(prompt.to_ints()))
        return _Response([_Sequence(list(self.tokens), [0.0] * len(self.tokens))] * num_samples)


async def check_episode(
    listing: EnvironmentListing, runtime: RolloutRuntime, model: str, renderer: Renderer | None
) -> tuple[list[str], list[str]]:
    """`loops check`'s lines and problems for a verifiers environment: its tasks and rubric (`listing`), then
    one episode of its first task (`runtime`'s) through a gateway serving `model`, each model call answered
    with `CHECK_REPLY`."""
    lines = listing.lines()
    if renderer is None or listing.problems():
        return lines, []  # no renderer to sample through (reported on its own), or refused already
    task = listing.tasks[0]
    capture = TokenCapture()
    llm = LoopsLLM(renderer, FixedReplyPolicy(renderer), capture, SamplingDefaults(max_tokens=16))
    offered: list[int] = []  # the tools each request offered (the capture keeps no tools)
    gateway = ModelGateway(model_name=model, on_request=lambda req: offered.append(len(req.tools or ())))
    await gateway.astart()
    try:
        attempt = Attempt(task, 0, 0, 0, 0, AttemptServices(llm=llm, capture=capture))
        evidence = await LeasedRuntime(runtime, gateway).run_attempt(attempt)
    finally:
        await gateway.astop()
    calls = capture.calls
    if not calls:
        detail = evidence.detail or "it made no model call"
        return lines, [
            f"verifiers environment {listing.env_id!r}: the check's episode of task {task.id} "
            f"never called the model through the gateway: {detail}"
        ]
    first = calls[0]
    lines.append(
        f"first call through the gateway: task {task.id}, {len(first.messages)} message(s), {offered[0]} tool(s), "
        f"prompt {len(first.prompt_tokens)} tokens; "
        f"the episode made {len(calls)} call(s) answered {CHECK_REPLY!r}"
    )
    if evidence.discarded is not None:
        return lines, [
            f"verifiers environment {listing.env_id!r}: the check's episode was discarded as "
            f"{evidence.discarded}: {evidence.detail}"
        ]
    metrics = ", ".join(f"{k.removeprefix('verifiers/')} {v:g}" for k, v in sorted(evidence.metrics.items()))
    lines.append(f"the rubric scored it {evidence.reward:g}" + (f" ({metrics})" if metrics else ""))
    return lines, []
