"""Every shell command the docs show: the files it names exist, and what can run offline does run.

Commands are read from fenced ```bash / ```sh / ```shell / ```console blocks (in ```console, only the
`$ ` lines) and from indented `uv run ...` lines of the documents in DOCUMENTS. Each command line is split
into simple commands (`&&`, `||`, `;`, `|`), stripped of `uv run [--extra X ...]`, `.venv/bin/` and
leading `VAR=value` assignments, and then:

- every path it names (a token ending in .toml/.json/.jsonl/.ipynb/.py, or starting with patterns/,
  examples/, notebooks/, tests/, docs/ or data/) must exist in the repository; `<placeholders>` are allowed;
- every `--extra NAME` must be an extra of pyproject.toml;
- `loops check CONFIG` runs in-process: a `[compute] scope = "local"` config must exit 0 offline, and a
  Baseten config must fail cleanly (exit 1 or 2, no traceback) naming BASETEN_API_KEY;
- `loops ... --help` and `loops glossary [--check]` run and exit 0;
- `loops run` of a local config must be covered by a named test or notebook (they train for minutes);
  `loops run` of a Baseten config must have its `loops check` shown in the docs too;
- every other command must match NOT_RUN_HERE, an explicit allow-list with the reason it is not run here.

A command that fits none of these fails `test_every_command_is_run_or_allow_listed`: run it here, or add it
to the allow-list with a reason.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DOCUMENTS = sorted(
    {
        REPO / "README.md",
        *(REPO / "docs").rglob("*.md"),
        REPO / "patterns" / "README.md",
        REPO / "examples" / "README.md",
        REPO / "tests" / "README.md",
        REPO / "CONTRIBUTING.md",
    }
)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "zsh"}
PATH_SUFFIXES = (".toml", ".json", ".jsonl", ".ipynb", ".py")
PATH_PREFIXES = ("patterns/", "examples/", "notebooks/", "tests/", "docs/", "data/")
PLACEHOLDER = "PLACEHOLDER"
_PLACEHOLDER_RE = re.compile(r"<[^<>\s][^<>]*>")
_OPERATORS = {";", "&&", "||", "|", "&"}
_UV_RUN_VALUE_OPTIONS = {"--extra", "--with", "--group", "--python", "--project", "--directory"}

# Commands shown in the docs that this test does not run, each with the reason. Matched (re.match) against
# the normalised command: program and arguments, without `uv run` options, `.venv/bin/` or VAR=value.
NOT_RUN_HERE: list[tuple[str, str]] = [
    # Installing or releasing needs the network (PyPI); the extras named are checked against pyproject.toml.
    (r"uv (sync|lock|build|publish)\b", "installs from or publishes to PyPI (network)"),
    (r"python3? -m pip install uv$", "installs uv from PyPI (network)"),
    # The test suite itself, and the style checks, run by hand or by .ci/run, not from inside the suite.
    (r"pytest\b", "the test suite itself (.ci/run runs it)"),
    (r"ruff (check|format)\b", "style checks (CONTRIBUTING.md)"),
    (r"mypy loops_nb$", "type checks (CONTRIBUTING.md)"),
    (r"pre-commit install$", "installs a git hook in the user's clone (CONTRIBUTING.md)"),
    (
        r"python tests/durations\.py\b",
        "runs the whole suite to rewrite tests/README.md's durations table; .ci/run runs the suite",
    ),
    # Interactive or long-lived processes.
    (r"jupyter lab\b", "an interactive server; tests/browser runs JupyterLab headless"),
    (r"loops serve\b", "a long-lived server; tests/test_cli.py starts one and drives it with the SDK"),
    # Batch notebook runs: every notebook runs under papermill in tests/notebooks/test_notebooks.py, and
    # the parameters these commands pass are checked below.
    (r"papermill notebooks/\S+\.ipynb \S+\.ipynb", "tests/notebooks/test_notebooks.py runs every notebook"),
    # They need a crashed run or Baseten credentials.
    (
        r"loops cleanup \S+\.toml --state-dir \S*PLACEHOLDER",
        "needs a crashed run's state directory; tests/harbor/test_cleanup.py kills a run and cleans up after it",
    ),
    (r"loops deactivate\b", "needs a Baseten run and BASETEN_API_KEY"),
    (
        r"loops eval \S+\.toml\b",
        "evaluates a trained run's checkpoint (or the base model) for minutes; tests/rl/test_eval_command.py "
        "trains a tiny run and runs loops eval on base, latest and a periodic checkpoint",
    ),
    (
        r"loops runs\b",
        "reads run directories a user made (runs/ is empty in a clone); tests/widgets/test_run_compare.py runs "
        "loops runs on fixture runs of every status, and notebooks/compare_runs.ipynb reads a sweep it trains",
    ),
    (
        r"loops export \S*PLACEHOLDER",
        "needs a trained run; tests/test_after_training.py trains a tiny run, runs loops export (adapter and "
        "--merged), and loads both with peft and from_pretrained",
    ),
    # Writes the committed glossary; `loops glossary --check` runs here instead.
    (r"loops glossary --write$", "writes docs/reference/KNOB_GLOSSARY.md; --check runs here"),
    (
        r"python -m benchmarks(\.peak_memory)?( [\w.]+)*$",
        "measures speed or memory for minutes to hours; results are in docs/benchmarks.md",
    ),
    (
        r"harbor trials start -p patterns/harbor/tasks/hidden_game -a oracle -e loops_nb\.providers\.local:",
        "tests/harbor/test_local_environment.py runs the oracle on hidden_game in the local sandbox",
    ),
]

# `loops run` of a local config trains for minutes: each is exercised by these tests or notebooks (every
# notebook runs under papermill in tests/notebooks/test_notebooks.py). Each file must name the config.
LOCAL_RUNS_COVERED_BY: dict[str, list[str]] = {
    "patterns/custom_runtime/in_process_direct/train_local.toml": [
        "tests/rl/test_quickstart.py",
        "notebooks/rl_quickstart.ipynb",
    ],
    "patterns/custom_runtime/in_process_tools/train_local.toml": ["notebooks/pattern_in_process_tools.ipynb"],
    "patterns/custom_runtime/local_openai/train_local.toml": ["notebooks/pattern_local_openai.ipynb"],
    "patterns/harbor/in_process_direct/train_local.toml": [
        "notebooks/pattern_harbor_in_process_direct.ipynb"
    ],
    "patterns/harbor/local_openai/train_local.toml": [
        "tests/harbor/test_harbor_local_program.py",
        "notebooks/pattern_harbor_local_openai.ipynb",
    ],
    "examples/sft_tool_use/sft_local.toml": [
        "tests/sft/test_sft_examples.py",
        "notebooks/sft_tool_use.ipynb",
    ],
    "examples/sft_toucan/sft_local.toml": ["tests/sft/test_sft_examples.py", "notebooks/sft_toucan.ipynb"],
}


@dataclass(frozen=True)
class Command:
    """One simple command as a document shows it."""

    doc: str
    line: int
    text: str
    """The whole command line, as written."""
    program: str
    args: tuple[str, ...]
    extras: tuple[str, ...] = field(default=())

    @property
    def normalised(self) -> str:
        return " ".join([self.program, *self.args])

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


# -- extraction -------------------------------------------------------------------------------------------
def command_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, command text) of every shell command shown in a Markdown file."""
    fence: str | None = None
    language = ""
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        opening = re.match(r"^(```+|~~~+)\s*([\w+-]*)", stripped)
        if fence is None:
            if opening:
                fence, language = opening.group(1), opening.group(2).lower()
                continue
            indented = re.match(r"^(?: {4,}|\t)(uv run \S.*)$", raw)
            if indented:
                yield number, indented.group(1).strip()
            continue
        if stripped.startswith(fence) and stripped.strip("`~") == "":
            fence = None
            continue
        if language not in SHELL_LANGUAGES:
            continue
        if language == "console":
            if not stripped.startswith("$ "):
                continue
            stripped = stripped[2:].strip()
        if pending is not None:
            start, text = pending
            text += " " + stripped.removesuffix("\\").strip()
            pending = (start, text) if stripped.endswith("\\") else None
            if pending is None:
                yield start, text
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending = (number, stripped.removesuffix("\\").strip())
            continue
        yield number, stripped


def simple_commands(text: str) -> list[list[str]]:
    """A command line's simple commands as token lists; comments dropped, placeholders made one token."""
    lexer = shlex.shlex(_PLACEHOLDER_RE.sub(PLACEHOLDER, text), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in _OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def normalise(doc: str, line: int, text: str, tokens: list[str]) -> Command | None:
    tokens = list(tokens)
    while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
        tokens.pop(0)  # VAR=value before the program
    extras: list[str] = []
    if tokens[:2] == ["uv", "run"]:
        tokens = tokens[2:]
        while tokens and tokens[0].startswith("-"):
            option = tokens.pop(0)
            name, eq, value = option.partition("=")
            if name in _UV_RUN_VALUE_OPTIONS and not eq and tokens:
                value = tokens.pop(0)
            if name == "--extra":
                extras.append(value)
    elif tokens[:1] == ["uv"]:
        extras += [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "--extra"]
    if not tokens:
        return None
    program = tokens[0].rsplit("/", 1)[-1] if tokens[0].startswith((".venv/", "./.venv/")) else tokens[0]
    return Command(doc, line, text, program, tuple(tokens[1:]), tuple(extras))


def all_commands() -> list[Command]:
    found = []
    for path in DOCUMENTS:
        if not path.is_file():
            continue
        doc = str(path.relative_to(REPO))
        for line, text in command_lines(path):
            for tokens in simple_commands(text):
                command = normalise(doc, line, text, tokens)
                if command is not None:
                    found.append(command)
    return found


COMMANDS = all_commands()


# -- what a command names and does --------------------------------------------------------------------------
def named_paths(command: Command) -> list[str]:
    """Repository paths a command names (placeholders, outputs, URLs and absolute paths excluded)."""
    args = list(command.args)
    if command.program == "papermill":
        positional = [a for a in args if not a.startswith("-")]
        if len(positional) >= 2:
            args.remove(positional[1])  # the output notebook papermill writes
    out = []
    for token in [command.program, *args]:
        value = token.partition("=")[2] if token.startswith("-") else token
        if not value or PLACEHOLDER in value or "..." in value or "://" in value or "$" in value:
            continue
        if value.startswith("/") or value.startswith("-"):
            continue
        if value.endswith(PATH_SUFFIXES) or value.startswith(PATH_PREFIXES):
            out.append(value)
    return out


def loops_parts(command: Command) -> tuple[str, list[str]] | None:
    """(subcommand, its arguments) of a `loops` command; ("", [...]) for `loops --help`."""
    if command.program != "loops":
        return None
    args = [a for a in command.args if a not in ("-v", "--verbose")]
    if not args or args[0].startswith("-"):
        return "", args
    return args[0], args[1:]


def is_help(args: list[str]) -> bool:
    return "--help" in args or "-h" in args


def config_scope(config: str) -> str:
    with (REPO / config).open("rb") as f:
        return tomllib.load(f).get("compute", {}).get("scope", "local")


def config_recipe(config: str) -> str:
    with (REPO / config).open("rb") as f:
        return tomllib.load(f).get("recipe", "")


def loops_checks() -> list[tuple[str, tuple[str, ...]]]:
    """Every distinct `loops check CONFIG [--KEY VALUE ...]` the docs show."""
    seen: dict[tuple[str, tuple[str, ...]], None] = {}
    for command in COMMANDS:
        parts = loops_parts(command)
        if parts and parts[0] == "check" and parts[1] and not is_help(parts[1]):
            seen[(parts[1][0], tuple(parts[1][1:]))] = None
    return list(seen)


def loops_in_process() -> list[tuple[str, ...]]:
    """Every distinct `loops` command that runs here as it is: --help, and the glossary check."""
    seen: dict[tuple[str, ...], None] = {}
    for command in COMMANDS:
        parts = loops_parts(command)
        if parts is None:
            continue
        sub, args = parts
        if is_help(args) or (sub == "glossary" and args in ([], ["--check"])):
            seen[(sub, *args) if sub else tuple(args)] = None
    return list(seen)


def loops_runs() -> list[tuple[Command, str]]:
    out = []
    for command in COMMANDS:
        parts = loops_parts(command)
        if parts and parts[0] == "run" and parts[1] and not is_help(parts[1]):
            out.append((command, parts[1][0]))
    return out


def allow_listed(command: Command) -> str | None:
    for pattern, reason in NOT_RUN_HERE:
        if re.match(pattern, command.normalised):
            return reason
    return None


def classify(command: Command) -> str:
    """How this test deals with a command: `check`, `in-process`, `run`, or the allow-list's reason."""
    parts = loops_parts(command)
    if parts is not None:
        sub, args = parts
        if is_help(args) or (sub == "glossary" and args in ([], ["--check"])):
            return "in-process"
        if sub == "check" and args:
            return "check"
        if sub == "run" and args:
            return "run"
    reason = allow_listed(command)
    if reason is None:
        raise LookupError(command.normalised)
    return reason


# -- the tests ----------------------------------------------------------------------------------------------
def test_the_docs_show_commands() -> None:
    texts = {c.normalised for c in COMMANDS}
    assert "loops run patterns/custom_runtime/in_process_direct/train_local.toml" in texts
    assert "pytest -n 2" in texts  # `uv run --all-extras pytest -n 2`, the README's second command
    assert len(COMMANDS) > 30


def test_every_named_path_exists() -> None:
    missing = [
        f"{c.where}: {p} (in `{c.text}`)" for c in COMMANDS for p in named_paths(c) if not (REPO / p).exists()
    ]
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)


def test_every_extra_named_exists() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    unknown = [f"{c.where}: --extra {e}" for c in COMMANDS for e in c.extras if e not in extras]
    assert not unknown, f"extras not in pyproject.toml ({sorted(extras)}):\n" + "\n".join(unknown)


def test_every_command_is_run_or_allow_listed() -> None:
    unknown = []
    for command in COMMANDS:
        try:
            classify(command)
        except LookupError:
            unknown.append(f"{command.where}: {command.normalised}")
    assert not unknown, (
        "commands this test neither runs nor allow-lists; run them here or add them to NOT_RUN_HERE with "
        "the reason:\n" + "\n".join(unknown)
    )


def test_every_allow_list_entry_is_used() -> None:
    unused = [p for p, _ in NOT_RUN_HERE if not any(re.match(p, c.normalised) for c in COMMANDS)]
    assert not unused, f"NOT_RUN_HERE entries no document needs any more: {unused}"


def test_each_local_run_is_covered_by_a_test_that_names_its_config() -> None:
    problems = []
    for command, config in loops_runs():
        if not (REPO / config).is_file() or config_scope(config) != "local":
            continue
        covering = LOCAL_RUNS_COVERED_BY.get(config)
        if not covering:
            problems.append(
                f"{command.where}: `loops run {config}` is covered by no test (LOCAL_RUNS_COVERED_BY)"
            )
            continue
        for name in covering:
            path = REPO / name
            text = path.read_text(encoding="utf-8") if path.is_file() else ""
            parent, file = Path(config).parent.name, Path(config).name
            if config not in text and not (parent in text and file in text):
                problems.append(f"{name} does not name {config}")
    assert not problems, "\n".join(problems)


def test_each_baseten_run_has_its_check_in_the_docs() -> None:
    checked = {config for config, _ in loops_checks()}
    missing = [
        f"{command.where}: `loops run {config}` (needs BASETEN_API_KEY and bills) has no `loops check {config}`"
        for command, config in loops_runs()
        if (REPO / config).is_file() and config_scope(config) != "local" and config not in checked
    ]
    assert not missing, "\n".join(missing)


def test_papermill_commands_pass_parameters_the_notebook_has() -> None:
    import papermill as pm

    problems = []
    for command in COMMANDS:
        if command.program != "papermill":
            continue
        notebook = next(a for a in command.args if a.endswith(".ipynb"))
        params = pm.inspect_notebook(str(REPO / notebook))
        args = list(command.args)
        for i, arg in enumerate(args):
            if arg in ("-p", "--parameters") and i + 1 < len(args) and args[i + 1] not in params:
                problems.append(f"{command.where}: {notebook} has no parameter {args[i + 1]!r}")
    assert not problems, "\n".join(problems)


def test_pytest_markers_in_the_docs_are_declared() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        declared = {m.split(":")[0] for m in tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]}
    problems = []
    for command in COMMANDS:
        if command.program != "pytest":
            continue
        args = list(command.args)
        for i, arg in enumerate(args[:-1]):
            if arg == "-m":
                words = set(re.findall(r"[A-Za-z_]+", args[i + 1])) - {"and", "or", "not"}
                problems += [f"{command.where}: marker {w!r} is not declared" for w in words - declared]
    assert not problems, "\n".join(problems)


# -- running what can run offline -------------------------------------------------------------------------
@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A clean working directory, no Baseten key, and the config modules of one check forgotten after it.

    Configs beside each other share module names (`episode.py`, `agent.py`); in one process the second
    `load()` would reuse the first one's module, so modules imported from patterns/ or examples/ are dropped.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BASETEN_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    saved_path = list(sys.path)

    def forget_config_modules() -> None:
        roots = (str(REPO / "patterns"), str(REPO / "examples"))
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(roots):
                del sys.modules[name]

    forget_config_modules()
    yield tmp_path
    forget_config_modules()
    sys.path[:] = saved_path


def needs_for(config: str) -> str | None:
    """Why a config's offline check cannot run on this machine (a missing extra or tool), or None."""
    text = (REPO / config).read_text(encoding="utf-8")
    if "loops_nb.harbor" in text:
        try:
            import harbor  # noqa: F401
        except ImportError:
            return "needs the harbor extra (uv run --all-extras)"
        if 'provider = "local"' in text and shutil.which("bwrap") is None:
            return "needs bubblewrap (apt-get install bubblewrap)"
    return None


def run_loops(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from loops_nb.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help
        code = exc.code if isinstance(exc.code, int) else 0
    out = capsys.readouterr()
    return code, out.out + out.err


def check_params(local: bool) -> list[object]:
    return [
        pytest.param(config, overrides, id=" ".join([config, *overrides]))
        for config, overrides in loops_checks()
        if (REPO / config).is_file() and (config_scope(config) == "local") == local
    ]


LOCAL_CHECKS = check_params(local=True)
BASETEN_CHECKS = check_params(local=False)


@pytest.mark.slow
@pytest.mark.parametrize(("config", "overrides"), LOCAL_CHECKS)
def test_loops_check_of_a_local_config_passes_offline(
    config: str, overrides: tuple[str, ...], isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = needs_for(config)
    if reason:
        pytest.skip(reason)
    code, output = run_loops(["check", str(REPO / config), *overrides], capsys)
    assert code == 0, output
    assert "check: ok" in output and "Traceback" not in output, output


@pytest.mark.parametrize(("config", "overrides"), BASETEN_CHECKS)
def test_loops_check_of_a_baseten_config_fails_cleanly_without_the_key(
    config: str,
    overrides: tuple[str, ...],
    isolated: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, output = run_loops(["check", str(REPO / config), *overrides], capsys)
    assert code in (1, 2), output
    assert "Traceback" not in output, output
    assert "BASETEN_API_KEY" in output, output


@pytest.mark.parametrize("argv", loops_in_process(), ids=" ".join)
def test_loops_help_and_glossary_commands_run(
    argv: tuple[str, ...], isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = run_loops(list(argv), capsys)
    assert code == 0, output
    assert "Traceback" not in output, output
