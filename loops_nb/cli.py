"""The `loops` command (`loops --help` lists them): `check`, `run` and `eval` load a config and its
`--KEY VALUE` overrides; `runs`, `export`, `serve`, `deactivate`, `cleanup` and `glossary` take their own arguments.

A user's mistake is printed as one clear line (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import RunFailed, UserError
from loops_nb.local.model_store import DTYPES

if TYPE_CHECKING:
    from loops_nb.project import Project

EXIT_USER_ERROR = 2


_CONFIG = "a .toml or .json config (a shipped one by its path)"
PROJECT_COMMANDS = {
    "check": ("resolve, render and prepare; launches no trainer", _CONFIG),
    "run": ("train", _CONFIG),
    "eval": (
        "RL: evaluate a checkpoint with the config's [eval]; trains nothing",
        "an RL config (its output.run_name names the run)",
    ),
}
"""The commands that load a config (CONFIG [--KEY VALUE ...]): their help and their CONFIG's help."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loops", description="Post-train open LLMs with LoRA on Baseten Loops."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, config_help) in PROJECT_COMMANDS.items():
        p = sub.add_parser(name, help=text, add_help=False, description=text)
        p.add_argument("config", nargs="?", help=config_help)
        p.add_argument("-h", "--help", action="store_true", help="show settings with their defaults")
    check, evaluate = sub.choices["check"], sub.choices["eval"]
    evaluate.add_argument("--checkpoint", default="latest", help="base, latest (default), a name, or a step")
    evaluate.add_argument(
        "--out", type=Path, default=None, help="write the results here (default <run>/evals/...)"
    )
    check.add_argument("--refusals", type=Path, metavar="FILE", help="SFT: write every refused row as JSONL")
    p = sub.add_parser("serve", help="a local Loops for several notebooks or scripts")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--model", action="append", default=[], help="preload this base model (repeatable)")
    p.add_argument("--state-dir", type=Path, default=None, help="where runs and checkpoints are kept")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="base weights (see [compute.local] dtype)")
    p.add_argument(
        "--memory-budget-mb", type=int, default=None, help="per trainer micro-batch and sampler KV cache"
    )
    p.add_argument(
        "--idle-run-minutes",
        type=float,
        default=30.0,
        help="move an idle run's trainer to disk after this long (0: never); it comes back on its next call",
    )
    p = sub.add_parser("deactivate", help="end a run and its paired sampler (checkpoints stay)")
    p.add_argument("run_id")
    p.add_argument("--config", help="a config whose [compute] says where the run is")
    p = sub.add_parser("cleanup", help="release what a crashed run's resource journal lists as alive")
    p.add_argument("config", help="the run's config (its [providers.<name>] tables)")
    p.add_argument(
        "--state-dir", type=Path, required=True, help="the run's state directory: runs/<run>/state"
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be released; release nothing")
    p.add_argument("--force", action="store_true", help="release even while the run's process still holds it")
    p = sub.add_parser(
        "runs", help="the runs table: name, recipe, model, steps, status, reward, eval, wall time"
    )
    p.add_argument(
        "runs", nargs="*", default=["runs/*"], help="run directories, globs or folders (default runs/*)"
    )
    text = "write a run's LoRA adapter (PEFT), or the base model with it merged, to a new directory"
    p = sub.add_parser("export", help=text, description=text)
    p.add_argument("run_dir", type=Path, help="the run directory (runs/<run_name>)")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="the new directory to write")
    p.add_argument(
        "--checkpoint",
        default="latest",
        help="latest (default), a step, or a name (final-000008, state-000004)",
    )
    p.add_argument(
        "--merged", action="store_true", help="merge the adapter into the base model (safetensors)"
    )
    p.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto", help="merged weights"
    )
    p = sub.add_parser("glossary", help="print or write docs/reference/KNOB_GLOSSARY.md")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="write the file (in a checkout)")
    g.add_argument("--check", action="store_true", help="exit 1 when the committed file is stale")
    return parser


_USAGE = {
    "check": (
        " [--refusals FILE]",
        "--refusals FILE: for an SFT config, write every refused row to FILE as JSONL.\n",
    ),
    "eval": (
        " [--checkpoint base|latest|NAME] [--out DIR]",
        "--checkpoint: base (the base model), latest (the run's last checkpoint), a checkpoint's name\n"
        "(final-000008, state-000004) or step (8). The run is output.run_name's; the [eval] settings apply.\n",
    ),
}


def _print_help(command: str, config: str | None) -> None:
    from loops_nb.config.glossary import knob_help

    recipe = None
    if config:
        with contextlib.suppress(UserError):
            from loops_nb.project import load

            recipe = load(config).recipe
    options, note = _USAGE.get(command, ("", ""))
    print(f"usage: loops {command} CONFIG{options} [--KEY VALUE ...]\n")
    if note:
        print(note)
    print('Any setting can be overridden: --training.max_steps 5 (values parse as TOML: 5, true, "x").\n')
    print(knob_help(recipe))


def _say(lines: Iterable[str], status: int = 0) -> int:
    """Print a report's lines; returns `status` (the command's exit status)."""
    for line in lines:
        print(line)
    return status


async def _check(project: Project, args: argparse.Namespace) -> int:
    refusals = args.refusals
    if refusals is not None and project.recipe != "sft":
        raise UserError(f"--refusals is for SFT configs; {project.path} is a {project.recipe} config")
    report = await project.check(**({"refusals": refusals} if refusals is not None else {}))
    return _say(report.describe(), 0 if getattr(report, "ok", True) else 1)


async def _train(project: Project, args: argparse.Namespace) -> int:
    outcome = await project.train()
    failed = getattr(outcome, "status", None) == "failed"
    return _say(outcome.describe() if hasattr(outcome, "describe") else [str(outcome)], int(failed))


async def _eval(project: Project, args: argparse.Namespace) -> int:
    return _say((await project.evaluate(checkpoint=args.checkpoint, out=args.out)).describe())


async def _project_command(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """check, run or eval: load the config (with its overrides), describe the project, then the command."""
    from loops_nb.config import load_config
    from loops_nb.project import Project

    loaded = load_config(args.config, overrides, cli_env=True)
    project = Project(path=loaded.source.path, source=loaded.source, config=loaded.config)
    _say(project.describe())
    return await {"check": _check, "run": _train, "eval": _eval}[args.command](project, args)


def _serve(args: argparse.Namespace) -> int:
    import threading

    from loops_nb.local.embedded import EmbeddedLoops

    loops = EmbeddedLoops(
        host=args.host,
        port=args.port,
        api_key=os.environ.get("LOOPS_LOCAL_API_KEY"),
        state_dir=args.state_dir,
        device=args.device,
        dtype=args.dtype,
        memory_budget_mb=args.memory_budget_mb,
        idle_run_seconds=args.idle_run_minutes * 60 or None,
        preload=tuple(args.model),
    )
    loops.start()
    print("Embedded Loops is serving. Run any baseten-loops (or tinker) script under:")
    for key, value in loops.env().items():
        print(f"{key}={value}")
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopping")
    finally:
        loops.stop()
    return 0


def _deactivate(args: argparse.Namespace) -> int:
    from loops_nb.compute import BASETEN_URL, deactivate_run

    base_url = os.environ.get("LOOPS_BASE_URL") or BASETEN_URL
    if args.config:
        from loops_nb.config import load_config

        base_url = load_config(args.config, cli_env=True).config.compute.base_url or base_url
    api_key = os.environ.get("BASETEN_API_KEY")
    if not api_key:
        raise UserError("loops deactivate needs BASETEN_API_KEY (and LOOPS_BASE_URL for a local server)")
    deactivate_run(args.run_id, base_url, api_key)
    print(f"deactivated {args.run_id}")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from loops_nb.cleanup import cleanup
    from loops_nb.config import load_config

    config = load_config(args.config, cli_env=True).config
    providers = getattr(config, "providers", {}) or {}
    report = asyncio.run(cleanup(args.state_dir, providers, dry_run=args.dry_run, force=args.force))
    return _say(report.describe(), 0 if report.ok else 1)


def _runs(args: argparse.Namespace) -> int:
    from loops_nb.runs_table import read_runs

    return _say(read_runs(args.runs).describe())


def _export(args: argparse.Namespace) -> int:
    from loops_nb.export import export_run

    result = asyncio.run(
        export_run(args.run_dir, args.to, checkpoint=args.checkpoint, merged=args.merged, dtype=args.dtype)
    )
    return _say(result.describe())


def _glossary(args: argparse.Namespace) -> int:
    from loops_nb.config.glossary import GLOSSARY_PATH, glossary_markdown
    from loops_nb.shipped import shipped_root

    text = glossary_markdown()
    if not (args.write or args.check):
        print(text, end="")
        return 0
    root = shipped_root() or Path.cwd()
    target = root / GLOSSARY_PATH
    if args.check:
        if (target.read_text() if target.exists() else "") != text:
            print(f"{target} is stale: run `loops glossary --write`", file=sys.stderr)
            return 1
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")
    return 0


COMMANDS = {f.__name__[1:]: f for f in (_runs, _export, _serve, _deactivate, _cleanup, _glossary)}
"""The other commands: each takes its parsed arguments (no overrides) and returns the exit status."""


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    _configure_logging(args.verbose)
    try:
        if args.command in PROJECT_COMMANDS:
            if args.help or not args.config:
                _print_help(args.command, args.config)
                return 0 if args.help else EXIT_USER_ERROR
            from loops_nb.config import split_overrides

            return asyncio.run(_project_command(args, split_overrides(rest)))
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"loops: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunFailed as exc:
        print(f"loops: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("loops: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
