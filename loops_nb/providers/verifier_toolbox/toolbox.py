"""Offline stand-ins for what Harbor's standard `tests/test.sh` fetches: uv/uvx, curl, wget, apt-get, pip.

In the local sandbox dpkg is read-only and there is no network, so the template's installs would fail and it
would write reward 0. On the verifier's PATH only, these run what it asks for from the Python environment that
runs loops_nb (docs/reference/harbor.md, "Verifiers in the local sandbox", has what each one does). What they
cannot give is a line appended to `$LOOPS_NB_VERIFIER_PROBLEMS`, and the attempt is discarded as
`verifier_error` instead of scored. Standard library only: this file runs as a script inside the sandbox, on
the host's Python, without importing loops_nb.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = HERE / "bin"
UV_INSTALLER = re.compile(r"^https?://(astral\.sh/uv/|github\.com/astral-sh/uv/releases/.*installer\.sh)")
# curl exit codes that mean the network, not the server's answer: resolve, connect, timeout, TLS, empty reply.
CURL_NETWORK_CODES = {5, 6, 7, 28, 35, 52, 55, 56}
WGET_NETWORK_CODE = 4
# pytest plugins that only write a report: their flags (and the flag's value) can be dropped.
REPORT_ONLY_PLUGINS = {"pytest-json-ctrf": ("--ctrf",)}
# uvx / uv run options that take a value.
_VALUE_OPTIONS = (
    "-p --python -w --with --with-editable --with-requirements --from --index --index-url "
    "--default-index --extra-index-url -i -c --constraints --overrides --cache-dir "
    "--python-preference --directory --project --env-file --extra --group --index-strategy "
    "--keyring-provider --resolution --prerelease --exclude-newer --color --config-file "
    "--managed-python"
)
VALUE_OPTIONS = set(_VALUE_OPTIONS.split())
INSTALLER_SCRIPT = """#!/bin/sh
# loops_nb local sandbox: uv comes from the host (uv, uvx and pytest are on PATH); nothing to install.
mkdir -p "$HOME/.local/bin" 2>/dev/null
printf '# uv is on PATH already (loops_nb local sandbox)\\n' > "$HOME/.local/bin/env" 2>/dev/null
echo "uv: provided by the loops_nb local sandbox (the host's Python environment)" >&2
exit 0
"""


def note(message: str) -> None:
    print(f"loops_nb local sandbox: {message}", file=sys.stderr, flush=True)


def problem(message: str, code: int = 2) -> int:
    """Record why the verifier cannot run here (the provider discards the attempt), and fail."""
    note(message)
    report = os.environ.get("LOOPS_NB_VERIFIER_PROBLEMS")
    if report:
        try:
            with open(report, "a", encoding="utf-8") as out:
                out.write(message + "\n")
        except OSError as exc:
            note(f"could not record the problem in {report}: {exc}")
    return code


def host_has_network() -> bool:
    return os.environ.get("LOOPS_NB_SANDBOX_NETWORK") == "host"


def real_tool(name: str) -> str | None:
    """`name` on PATH past these stand-ins."""
    entries = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != BIN]
    return shutil.which(name, path=os.pathsep.join(entries))


# -- requirements --------------------------------------------------------------------------------------
def split_requirement(text: str) -> tuple[str, str]:
    """(distribution name, version specifier) of a requirement such as `pytest==8.4.1` or `ruff>=0.5`."""
    text = text.split(";", 1)[0].strip()
    match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$", text)
    if not match:
        return text, ""
    return match.group(1), match.group(3).strip()


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def satisfies(version: str, specifier: str) -> bool:
    if not specifier:
        return True
    try:
        from packaging.specifiers import SpecifierSet

        return version in SpecifierSet(specifier)
    except Exception:  # no packaging, or a specifier it cannot read: compare an exact pin by hand
        return specifier.lstrip("=") == version


def install_hint(missing: list[str]) -> str:
    """The command that installs exactly what is missing where loops_nb runs: `uv add --dev pytest-xdist`."""
    names = [split_requirement(m)[0] or m for m in missing]
    return "`uv add --dev " + " ".join(dict.fromkeys(names)) + "`"


def missing_requirements(requirements: list[str]) -> tuple[list[str], list[str]]:
    """(requirements the host lacks, notes about versions other than the pinned ones)."""
    missing, notes = [], []
    for requirement in requirements:
        name, specifier = split_requirement(requirement)
        if not name or name.startswith(("-", ".", "/")) or "://" in requirement:
            missing.append(requirement)  # a path, URL or option: nothing to match on the host
            continue
        version = installed_version(name)
        if version is None:
            missing.append(requirement)
        elif not satisfies(version, specifier):
            notes.append(f"{requirement} asked for, the host's {name} {version} used")
    return missing, notes


# -- uvx / uv ------------------------------------------------------------------------------------------
def parse_tool_options(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """uvx-style options before the command: ({option: [values]}, [command, *its args])."""
    options: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-"):
            break
        key, _, value = arg.partition("=")
        if key in VALUE_OPTIONS and not value:
            value = args[index + 1] if index + 1 < len(args) else ""
            index += 1
        options.setdefault(key, []).append(value)
        index += 1
    return options, args[index:]


def option_values(options: dict[str, list[str]], *keys: str) -> list[str]:
    out: list[str] = []
    for key in keys:
        for value in options.get(key, []):
            out += [part for part in value.split(",") if part]
    return out


def _requirements_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return [f"-r {path}"]
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def run_tool(args: list[str], *, with_command_requirement: bool) -> int:
    """`uvx [opts] CMD ...` (and `uv run`): CMD from the host environment, if it has what is asked for."""
    options, command = parse_tool_options(args)
    if not command:
        return problem("uvx: no command given")
    name, *rest = command
    tool_from = option_values(options, "--from")
    requirements = option_values(options, "-w", "--with")
    for path in option_values(options, "--with-requirements"):
        requirements += _requirements_file(path)
    tool_name, _ = split_requirement(name)
    if tool_from:
        requirements += tool_from
    elif with_command_requirement and tool_name not in ("python", "python3"):
        requirements.append(name)
    missing, notes = missing_requirements(requirements)
    for line in notes:
        note(line)
    for python in options.get("-p", []) + options.get("--python", []):
        if python and not sys.version.startswith(python.removeprefix("python").removeprefix("cpython-")):
            note(f"Python {python} asked for, the host's {sys.version.split()[0]} used")
    for plugin, flags in REPORT_ONLY_PLUGINS.items():
        if any(split_requirement(m)[0] == plugin for m in missing):
            missing = [m for m in missing if split_requirement(m)[0] != plugin]
            rest = _drop_flags(rest, flags)
            note(
                f"{plugin} is not installed on the host: {', '.join(flags)} dropped (it only writes a report)"
            )
    if missing:
        if host_has_network() and real_tool("uvx"):
            note(f"the host lacks {', '.join(missing)}: the real uvx fetches them")
            return subprocess.call([real_tool("uvx") or "uvx", *args])
        return problem(
            f"uvx {name}: the host's Python environment ({sys.executable}) lacks {', '.join(missing)}, and "
            f"the local sandbox installs nothing. Install it where loops_nb runs ({install_hint(missing)}), "
            'or set [providers.local] network = "host" on a machine with network'
        )
    return _exec(tool_name, rest)


def _drop_flags(args: list[str], flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False  # the value of a flag just dropped
    for arg in args:
        if not skip and arg not in flags and not arg.startswith(tuple(flag + "=" for flag in flags)):
            out.append(arg)
        skip = not skip and arg in flags
    return out


def _exec(command: str, args: list[str]) -> int:
    scripts = Path(sys.executable).parent
    if command in ("python", "python3") or command.startswith("python3."):
        argv = [sys.executable, *args]
    elif (scripts / command).is_file():
        argv = [str(scripts / command), *args]
    elif command in ("pytest", "py.test"):
        argv = [sys.executable, "-m", "pytest", *args]
    else:
        return problem(f"uvx {command}: the host's Python environment ({scripts}) has no {command} command")
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # not reached


def uv(args: list[str]) -> int:
    if not args or args[0] in ("--version", "-V", "version", "self"):
        print("uv (loops_nb local sandbox: the host's Python environment)")
        return 0
    sub, rest = args[0], args[1:]
    if sub == "tool" and rest[:1] == ["run"]:
        return run_tool(rest[1:], with_command_requirement=True)
    if sub == "run":
        return run_tool(rest, with_command_requirement=False)
    if sub in ("init", "venv", "sync", "lock", "cache"):
        note(f"uv {sub}: nothing to do (the host's Python environment is the project)")
        return 0
    if (
        sub == "add"
        or (sub == "pip" and rest[:1] == ["install"])
        or (sub == "tool" and rest[:1] == ["install"])
    ):
        return install(rest[1:] if sub in ("pip", "tool") else rest, f"uv {' '.join(args[:2])}")
    return problem(f"uv {sub}: not available offline in the local sandbox")


def install(args: list[str], what: str) -> int:
    """`uv add`, `uv pip install`, `pip install`: fine when the host already has every package."""
    requirements: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in ("-r", "--requirement", "--requirements"):
            requirements += _requirements_file(args[index + 1] if index + 1 < len(args) else "")
            index += 2
            continue
        if arg.startswith("-"):
            index += 2 if arg in VALUE_OPTIONS or arg in ("--target", "--prefix") else 1
            continue
        requirements.append(arg)
        index += 1
    missing, notes = missing_requirements(requirements)
    for line in notes:
        note(line)
    if missing:
        return problem(
            f"{what}: the host's Python environment lacks {', '.join(missing)} and there is no network"
        )
    note(f"{what}: the host's Python environment already has {', '.join(requirements) or 'everything'}")
    return 0


# -- curl, wget, apt-get ---------------------------------------------------------------------------------
def fetch(tool: str, args: list[str]) -> int:
    urls = [a for a in args if re.match(r"^https?://", a)]
    if urls and all(UV_INSTALLER.match(u) for u in urls) and not host_has_network():
        output = _output_file(tool, args)
        if output:
            Path(output).write_text(INSTALLER_SCRIPT, encoding="utf-8")
        else:
            sys.stdout.write(INSTALLER_SCRIPT)
        return 0
    real = real_tool(tool)
    if real is None:
        return problem(f"missing command: {tool} is not on this host", 127)
    code = subprocess.call([real, *args])
    network_failure = code in CURL_NETWORK_CODES if tool == "curl" else code == WGET_NETWORK_CODE
    if network_failure:
        where = " ".join(urls) or "a URL"
        why = "the sandbox has no network" if not host_has_network() else "the host's network failed"
        problem(f"network error: {tool} {where} exited {code} ({why})", code)
    return code


def _output_file(tool: str, args: list[str]) -> str | None:
    flags = ("-o", "--output") if tool == "curl" else ("-O", "--output-document")
    for index, arg in enumerate(args):
        if arg in flags and index + 1 < len(args) and args[index + 1] != "-":
            return args[index + 1]
    return None


def apt(args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] != "install":
        note(f"apt-get {' '.join(words[:1])}: nothing to do (the host's packages are the image)")
        return 0
    packages = apt_packages(words[1:])
    missing = [p for p in packages if not host_has_package(p)]
    if missing:
        return problem(
            f"apt-get install: the host lacks {', '.join(missing)} and dpkg is read-only here", 100
        )
    note(f"apt-get install: the host already has {', '.join(packages)}")
    return 0


def apt_packages(words: list[str]) -> list[str]:
    """The packages `apt-get install WORDS` names: options dropped, versions and architectures cut off."""
    return [re.split(r"[=:]", w, maxsplit=1)[0] for w in words if not w.startswith("-")]


def host_has_package(package: str) -> bool:
    if shutil.which(package):
        return True
    try:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return status.returncode == 0 and "install ok installed" in status.stdout


def main(argv: list[str]) -> int:
    tool, args = argv[0], argv[1:]
    if tool == "uvx":
        return run_tool(args, with_command_requirement=True)
    if tool == "uv":
        return uv(args)
    if tool in ("curl", "wget"):
        return fetch(tool, args)
    if tool in ("apt-get", "apt"):
        return apt(args)
    if tool in ("pip", "pip3"):
        if args[:1] == ["install"]:
            return install(args[1:], "pip install")
        return subprocess.call([sys.executable, "-m", "pip", *args])
    return problem(f"{tool}: no offline stand-in")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
