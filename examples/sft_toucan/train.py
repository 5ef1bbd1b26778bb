"""Train this example and, optionally, compare the base model with the trained adapter on held-out rows.

    python examples/sft_toucan/train.py                        # train sft_local.toml (a demonstration on a CPU)
    python examples/sft_toucan/train.py --compare 10           # ... then compare on 10 held-out conversations
    python examples/sft_toucan/train.py --compare 10 --turns last --training.max_steps 40
    python examples/sft_toucan/train.py sft.toml --compare 50  # serverless (needs BASETEN_API_KEY)

Any `--section.key value` is a config override, as with `loops run`. A run directory that exists is resumed (a
finished one returns at once), so `--compare` after `loops run` compares without retraining. `--turns all` (the
default here) scores every assistant turn, the tool call and the final answer; `last` only the final one. The
table is written to `<run dir>/comparison.csv`. The work is done by `loops_nb.sft.compare_command.main`.
"""

from pathlib import Path

from loops_nb.sft.compare_command import main

if __name__ == "__main__":
    main(config_dir=Path(__file__).resolve().parent)
