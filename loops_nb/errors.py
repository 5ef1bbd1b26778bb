"""loops_nb's exceptions: one root, `LoopsNbError`, and a class per boundary a fault crosses.

A `UserError` is the user's to fix: the CLI prints it as one line (never a traceback) naming the file, row or
key at fault and what would be valid. Each module's own classes derive from one of these
(`SandboxDied(SandboxError)`); anything else that escapes is a bug in loops_nb.
"""

from __future__ import annotations


class LoopsNbError(Exception):
    """The root of every exception loops_nb raises on purpose."""


class UserError(LoopsNbError):
    """Something the user can fix: bad config, bad data, missing credentials, a wrong path."""


class ConfigError(UserError):
    """A config file or override that cannot be used as written."""


class DataError(UserError):
    """A dataset file or row that cannot be used as written."""


class CredentialsError(UserError):
    """A scope or provider that needs credentials the environment does not hold."""


class SandboxError(LoopsNbError):
    """A sandbox, a command in it or its verifier failed (not the model's answer): the attempt is discarded."""


class ModelAccessError(LoopsNbError):
    """An attempt's request to the policy model was refused or could not be answered."""


class TrainerError(LoopsNbError):
    """The embedded Loops (its trainer or sampler) refused a request or lost what it was serving."""


class RenderingError(LoopsNbError):
    """A conversation a model's renderer cannot write as asked (a row that cannot train, a turn it parts from)."""


class RunFailed(LoopsNbError):
    """A fault the run could not survive (a trainer error, a full disk) stopped it between steps.

    Nothing is lost: every finished step is logged and the run resumes from its last checkpoint. The
    message says where it stopped, why, and the command that resumes it.
    """

    def __init__(self, run_dir: str, step: int, resume_step: int, cause: BaseException) -> None:
        self.run_dir, self.step, self.resume_step, self.cause = run_dir, step, resume_step, cause
        name = run_dir.rstrip("/").rsplit("/", 1)[-1]
        super().__init__(
            f"run {run_dir} stopped at step {step}: {describe_cause(cause)}. Its state is kept: run "
            f"the same config with --output.run_name {name} to resume from step {resume_step} (its last checkpoint)"
        )


def describe_cause(cause: BaseException) -> str:
    """`ExceptionType: message`, plus the request it was about when the message does not say.

    httpx's connection errors read "All connection attempts failed" with no address; naming the
    request says which server (a Loops that went away, say) the run could not reach.
    """
    text = f"{type(cause).__name__}: {cause}"
    try:
        request = getattr(cause, "request", None)  # httpx raises RuntimeError when none was attached
    except RuntimeError:
        request = None
    url, method = getattr(request, "url", None), getattr(request, "method", None)
    if url is not None and method and str(url) not in text:
        text += f" ({method} {url})"
    return text
