"""A stand-alone agent: asks the quickstart's question through any OpenAI-compatible endpoint.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... python agent.py ["question"]

It knows nothing of loops_nb: it reads the two standard variables (the `openai` client does) and prints
the model's answer. During training the episode sets them to the run's model gateway and this attempt's
lease, so every call is sampled from the current policy and captured exactly for training.
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI

PROMPT = "What is the most famous board game? Answer with its name only."


def main(argv: list[str]) -> int:
    question = argv[1] if len(argv) > 1 else PROMPT
    client = OpenAI(timeout=120.0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    reply = client.chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        messages=[{"role": "user", "content": question}],
    )
    print(reply.choices[0].message.content or "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
