"""The command line the SFT examples' `train.py` run: train a config, then compare base model and adapter.

    python examples/sft_tool_use/train.py --compare 20 --turns last --training.max_steps 40

A composition root like `cli.py` (the comparison itself is `loops_nb.sft.compare.compare`); each example's
`train.py` calls `main(config_dir=<its folder>)`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from loops_nb.config import split_overrides
from loops_nb.errors import UserError
from loops_nb.project import load
from loops_nb.sft.compare import compare


def main(argv: list[str] | None = None, *, config_dir: Path | None = None) -> None:
    """``[CONFIG] [--compare ROWS] [--KEY VALUE ...]``: train the config (a finished run returns at once, so a run
    made by `loops run` is compared without retraining), then compare; a bare config name is looked up in
    ``config_dir`` (the example's folder)."""
    parser = argparse.ArgumentParser(
        usage="%(prog)s [CONFIG] [--compare ROWS] [--turns last|all] [--max-tokens N] [--KEY VALUE ...]",
        description="Train an SFT config (default sft_local.toml), then compare base model and adapter.",
    )
    parser.add_argument(
        "--compare", type=int, default=0, metavar="ROWS", help="compare on this many held-out rows"
    )
    parser.add_argument(
        "--turns", choices=["last", "all"], default="all", help="which assistant turns to score"
    )
    parser.add_argument("--max-tokens", type=int, default=160, help="most tokens per compared reply")
    argv = list(sys.argv[1:] if argv is None else argv)
    # The config is the first argument unless it is a flag: an argparse positional would swallow the values of
    # the `--KEY VALUE` overrides, which argparse does not know.
    name = argv.pop(0) if argv and not argv[0].startswith("-") else "sft_local.toml"
    args, rest = parser.parse_known_args(argv)
    config = Path(name)
    if not config.exists() and config_dir is not None:
        config = config_dir / config
    try:
        overrides = split_overrides(rest)
    except UserError as exc:
        parser.error(str(exc))
    project = load(config, overrides=overrides)

    async def run() -> None:
        outcome = await project.train()
        print("\n".join(outcome.describe()))
        if args.compare:
            comparison = await compare(
                project, outcome, rows=args.compare, turns=args.turns, max_tokens=args.max_tokens
            )
            print("\n".join(comparison.describe()))
            table = Path(outcome.run_dir) / "comparison.csv"
            comparison.table.to_csv(table, index=False)
            print(f"table: {table}")

    try:
        asyncio.run(run())
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None
