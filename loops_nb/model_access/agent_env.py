"""The environment an agent program starts with: an allowlist of ours, plus its attempt's lease.

Built from an allowlist, never by removing known secrets from ours: an `AWS_SECRET_ACCESS_KEY`, a
`GITHUB_TOKEN` or a line of `.env` is on no list of the run's credentials. `LeasedRuntime` opens `leased_env`
and `passing_env` around each attempt, so code that launches agents without an attempt in hand (an Episode's
`run`) still gets that attempt's lease and names.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterable, Iterator

from loops_nb.runtime import Attempt

BASE_VARIABLES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
"""What every agent program inherits from the training process (plus `LC_*`)."""

LEASE_VARIABLES = frozenset({"OPENAI_BASE_URL", "OPENAI_API_KEY"})
"""Set from the attempt's lease; a program never inherits the training process's values of these."""

SECRET_VARIABLES = frozenset(
    {
        "BASETEN_API_KEY",
        "LOOPS_LOCAL_API_KEY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "WANDB_API_KEY",
        "BL_API_KEY",
        "BL_CLIENT_CREDENTIALS",
        "DAYTONA_API_KEY",
        "DAYTONA_JWT_TOKEN",
        "ANTHROPIC_API_KEY",
    }
)
"""The run's own credentials: `[runtime] agent_env` may not pass them to agent programs."""

QUIET_FRAMEWORKS = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}
"""Set for every agent program (unless `[runtime] agent_env` passes the name): the OpenAI Agents SDK
otherwise exports traces to OpenAI's servers, authenticated with `OPENAI_API_KEY`, the lease key."""

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_passed_names: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "loops_nb_agent_env", default=()
)
_current_env: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("loops_nb_model_env")


def refused_agent_env_name(name: str) -> str | None:
    """Why `[runtime] agent_env` may not name `name`, or None when it may."""
    if not ENV_NAME.match(name):
        return f"{name!r} is not an environment variable name"
    if name in SECRET_VARIABLES:
        return f"{name} is one of the run's credentials, which agent programs never get"
    if name in LEASE_VARIABLES:
        return f"{name} is set from the attempt's lease"
    return None


@contextlib.contextmanager
def passing_env(names: Iterable[str]) -> Iterator[None]:
    """Within this block (an attempt), agent programs also inherit these variables (`[runtime] agent_env`)."""
    token = _passed_names.set(tuple(names))
    try:
        yield
    finally:
        _passed_names.reset(token)


@contextlib.contextmanager
def leased_env(attempt: Attempt) -> Iterator[None]:
    """Within this block (an attempt), `model_env()` without an attempt gives this attempt's lease."""
    token = _current_env.set(model_env(attempt))
    try:
        yield
    finally:
        _current_env.reset(token)


def model_env(attempt: Attempt | None = None) -> dict[str, str]:
    """`OPENAI_BASE_URL` and `OPENAI_API_KEY` for an agent process of this attempt (default: the running one)."""
    if attempt is None:
        env = _current_env.get(None)
        if env is not None:
            return dict(env)
        url = key = None
    else:
        url, key = attempt.services.model_base_url, attempt.services.model_api_key
    if not url or not key:
        raise RuntimeError(
            "this attempt has no model lease: declare `model_access = ModelAccessMode.OPENAI_HTTP` on the "
            "runtime so the run starts the model gateway"
        )
    return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": key}


def agent_process_env(attempt: Attempt | None = None, *, extra: Iterable[str] = ()) -> dict[str, str]:
    """The environment to launch an agent program with: PATH, HOME and the locale of this process,
    the variables `[runtime] agent_env` (and `extra`) name, and the attempt's `OPENAI_BASE_URL` /
    `OPENAI_API_KEY`, with loopback kept off any proxy and frameworks' tracing to their vendors off
    (`QUIET_FRAMEWORKS`)."""
    named = {*_passed_names.get(), *extra}
    for name in named:
        why = refused_agent_env_name(name)
        if why is not None:
            raise ValueError(f"agent program environment: {why}")
    env = dict(QUIET_FRAMEWORKS)
    env.update(
        (k, v) for k, v in os.environ.items() if k in BASE_VARIABLES or k.startswith("LC_") or k in named
    )
    env.update(model_env(attempt))
    loopback = "127.0.0.1,localhost"
    env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY"), loopback]))
    return env
