"""The embedded Loops' one family of "the caller's request cannot be served as sent" errors.

Every route answers a `BadRequest` with 422 and its message (the SDK raises a 422 at once, where it retries
400, 404, 408 and 502 for an hour). Subclasses exist only where the error carries more than its message.
"""

from __future__ import annotations

from loops_nb.errors import TrainerError


class BadRequest(TrainerError, ValueError):
    """A request the embedded Loops refuses; its message names the thing at fault and what to do. Also a
    ValueError: `datum_wire` reads values inside `except ValueError`, and pydantic reports only those."""


class SampleRequestError(BadRequest):
    """A well-formed `/sample` request this model cannot serve; `field` names the offending body key.

    The message starts with the field, like pydantic's errors.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RunDeactivated(BadRequest):
    """A request for a run that `loops deactivate` (or `keep_run = false`) ended.

    Its trainer and its published policy are gone, so neither training nor sampling it can go on; its
    saved checkpoints stay on disk and can still be served by a standalone sampler.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id} was deactivated: its trainer and its published policy are gone. Start a new run "
            "with create_lora_training_client (load_state a saved bt://loops:…/weights/… to continue it), or "
            "sample a saved policy with create_sampling_client(model_path='bt://loops:"
            f"{run_id}/sampler_weights/<name>')"
        )
        self.run_id = run_id
