"""Running the episode driver (`episode_driver.py`) in the verifiers interpreter: `list` and `run`.

The driver is a standalone script (it imports verifiers, never loops_nb); each command prints one JSON object
on stdout (docs/reference/verifiers.md, "The episode driver"). `run` is the attempt's agent program: it is
launched as every agent program is (agent_program.py), with its attempt's lease key and a PID namespace of
its own, and killed with everything it started when the attempt ends or times out.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from loops_nb.model_access.agent_env import BASE_VARIABLES, agent_process_env
from loops_nb.model_access.agent_program import run_agent_program
from loops_nb.runtime import Attempt

LOAD_FAILED = 3
"""The driver's exit code when the environment cannot load (stderr's last line says why)."""

DRIVER = Path(__file__).with_name("episode_driver.py")
"""The kit's driver script, run by the verifiers interpreter."""

HF_VARIABLES = (
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HF_HUB_CACHE",
    "XDG_CACHE_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
)
"""Where the Hugging Face cache is, passed on so the verifiers process finds the datasets already there."""

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class DriverOutcome:
    """How a driver command ended: its exit code (None: killed at its timeout), its JSON and its stderr."""

    returncode: int | None
    result: dict[str, object] | None
    stderr: str
    unreadable: str = ""
    """Why stdout is not one JSON object, when it is not."""

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def reason(self) -> str:
        """stderr's last non-empty line (the driver's one-line reason for a load failure)."""
        lines = [line.strip() for line in self.stderr.strip().splitlines() if line.strip()]
        return lines[-1][:500] if lines else ""

    def tail(self, chars: int = 1500) -> str:
        return self.stderr.strip()[-chars:]


def parse_result(stdout: bytes) -> tuple[dict[str, object] | None, str]:
    """The one JSON object the driver printed (its last non-empty line, should a library print first)."""
    text = stdout.decode(errors="replace").strip()
    if not text:
        return None, "it printed nothing on stdout"
    for candidate in (text, text.splitlines()[-1]):
        try:
            value = json.loads(candidate)  # NaN and Infinity parse as floats: the reward check sees them
        except ValueError:
            continue
        if isinstance(value, dict):
            return value, ""
        return None, f"it printed a JSON {type(value).__name__}, not an object"
    return None, f"its stdout is not JSON: {text[-300:]!r}"


def driver_env(extra: tuple[str, ...], offline: bool) -> dict[str, str]:
    """The environment of a `list` (no attempt, so no lease): PATH, HOME, the locale, the Hugging Face
    cache settings and `extra`, never the run's credentials."""
    names = {*BASE_VARIABLES, *HF_VARIABLES, *extra}
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith("LC_")}
    if offline:
        env.update(OFFLINE)
    return env


async def run_driver(
    argv: list[str], *, timeout: float, env: dict[str, str], attempt: Attempt | None = None
) -> DriverOutcome:
    """Run one driver command to its end (or its timeout) as an agent program (an attempt's, for `run`)."""
    try:
        done = await run_agent_program(argv, attempt, env=env, timeout=timeout)
    except TimeoutError:
        return DriverOutcome(None, None, "")
    result, unreadable = parse_result(done.stdout) if done.returncode == 0 else (None, "")
    return DriverOutcome(done.returncode, result, done.stderr.decode(errors="replace"), unreadable)


def attempt_env(attempt: Attempt, extra: tuple[str, ...], offline: bool) -> dict[str, str]:
    """An attempt's driver environment: its agent program's (the lease), the HF cache settings and `extra`."""
    present = tuple(name for name in (*HF_VARIABLES, *extra) if name in os.environ)
    env = agent_process_env(attempt, extra=present)
    if offline:
        env.update(OFFLINE)
    return env


def finite(value: object) -> float | None:
    """`value` as a finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
