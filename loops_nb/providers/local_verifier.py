"""How the local sandbox runs a Harbor verifier: offline tools on its PATH, and a verifier that broke is no reward.

To training a broken verifier's reward 0 would look like a bad policy, so the verifier's command (only it)
gets `verifier_env` and `verifier_failure` says why its attempt is discarded as `verifier_error`
(docs/reference/harbor.md, "Verifiers in the local sandbox").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path, PurePosixPath

from loops_nb.errors import SandboxError
from loops_nb.providers.bubblewrap import DEFAULT_PATH
from loops_nb.providers.dockerfile_plan import logical_lines
from loops_nb.providers.verifier_toolbox import toolbox

TOOLBOX = Path(__file__).resolve().parent / "verifier_toolbox"
PROBLEMS_FILE = "loops_verifier_problems.txt"
LOG_TAIL = 2000


class VerifierCannotRun(SandboxError):
    """The verifier failed for a reason other than the tests: the attempt is discarded, never scored."""


def is_verifier_command(command: str, tests_dir: PurePosixPath, verifier_dir: PurePosixPath) -> bool:
    """Whether `command` is Harbor's verifier run: `(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1`."""
    head = command.lstrip("( '\"")
    return head.startswith(f"{tests_dir}/") and f"{verifier_dir}/" in command


def verifier_env(env: dict[str, str] | None, verifier_dir: PurePosixPath, network: str) -> dict[str, str]:
    """The verifier command's environment: the offline tools first on PATH, a problems file to report to."""
    env = dict(env or {})
    path = env.get("PATH") or DEFAULT_PATH
    return {
        **env,
        "PATH": f"{TOOLBOX / 'bin'}:{path}",
        "BASH_ENV": str(TOOLBOX / "bash_env.sh"),
        "LOOPS_NB_HOST_PYTHON": sys.executable,
        "LOOPS_NB_SANDBOX_NETWORK": network,
        "LOOPS_NB_VERIFIER_PROBLEMS": str(verifier_dir / PROBLEMS_FILE),
    }


def verifier_failure(
    return_code: int, host_verifier_dir: Path, log_name: str = "test-stdout.txt"
) -> str | None:
    """Why a finished verifier run is no reward (None: grade it), read from its host-side directory."""
    problems = read_text(host_verifier_dir / PROBLEMS_FILE).strip()
    log = read_text(host_verifier_dir / log_name)
    tail = log[-LOG_TAIL:].strip()
    if problems:
        why = "; ".join(dict.fromkeys(problems.splitlines()))
        return f"the verifier could not run in the local sandbox: {why}\n--- verifier log (end) ---\n{tail}"
    has_reward = any((host_verifier_dir / name).is_file() for name in ("reward.txt", "reward.json"))
    if return_code != 0 and not has_reward:
        return (
            f"the verifier exited {return_code} before writing a reward file"
            f"\n--- verifier log (end) ---\n{tail}"
        )
    return None


def read_text(path: Path) -> str:
    """The file's text ("" when it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# -- what `loops check` says about a verifier script ----------------------------------------------------
_URL = re.compile(r"https?://[^\s'\"|;)]+")
_FETCH = re.compile(r"(^|[\s;&|(])(curl|wget)\s")
_PIP_INSTALL = re.compile(r"(^|[\s;&|(])(pip3?|uv pip|python3? -m pip)\s+install\s+(?P<args>[^;&|]*)")
_APT_INSTALL = re.compile(r"(^|[\s;&|(])apt(-get)?\s+(-\S+\s+)*install\s+(?P<args>[^;&|]*)")
_UVX = re.compile(r"(^|[\s;&|(])(uvx|uv tool run|uv run)\s+(?P<args>[^;&|]*)")


def verifier_warnings(task: str, test_script: Path, network: bool) -> list[str]:
    """What the task's verifier script needs that the local sandbox cannot give it (one line each)."""
    try:
        lines = test_script.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    warnings: list[str] = []
    where = f"task {task}: tests/{test_script.name}"
    for number, line in logical_lines(lines):
        if _FETCH.search(line) and not network:
            urls = [u for u in _URL.findall(line) if not toolbox.UV_INSTALLER.match(u)]
            if urls:
                warnings.append(
                    f"{where} line {number} fetches {urls[0]}: the local sandbox has no network, so the "
                    'verifier will be discarded as verifier_error (set [providers.local] network = "host" '
                    "on a machine with network)"
                )
        for match in _APT_INSTALL.finditer(line):
            missing = [
                p for p in toolbox.apt_packages(match["args"].split()) if not toolbox.host_has_package(p)
            ]
            if missing:
                warnings.append(
                    f"{where} line {number} installs {', '.join(missing)} with apt, which this host lacks "
                    "and the local sandbox cannot install (dpkg is read-only): the verifier will be "
                    "discarded as verifier_error"
                )
        for match in _PIP_INSTALL.finditer(line):
            wanted = [w for w in match["args"].split() if not w.startswith("-")]
            missing, _ = toolbox.missing_requirements(wanted)
            if missing and not network:
                warnings.append(
                    f"{where} line {number} installs {', '.join(missing)}, which the Python environment "
                    f"running loops_nb ({sys.executable}) lacks, and there is no network"
                )
        for match in _UVX.finditer(line):
            warnings += _uvx_warnings(where, number, match["args"].split(), network)
    return warnings


def _uvx_warnings(where: str, number: int, args: list[str], network: bool) -> list[str]:
    options, command = toolbox.parse_tool_options(args)
    requirements = toolbox.option_values(options, "-w", "--with", "--from")
    if command and not options.get("--from") and command[0] not in ("python", "python3"):
        requirements.append(command[0])
    missing, _ = toolbox.missing_requirements(requirements)
    missing = [m for m in missing if toolbox.split_requirement(m)[0] not in toolbox.REPORT_ONLY_PLUGINS]
    if not missing or network:
        return []
    return [
        f"{where} line {number} runs uvx with {', '.join(missing)}, which the Python environment running "
        f"loops_nb ({sys.executable}) lacks: offline, the verifier will be discarded as verifier_error "
        f"(install them there: {toolbox.install_hint(missing)})"
    ]
