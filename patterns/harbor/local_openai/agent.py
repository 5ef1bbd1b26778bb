"""A stand-alone agent program: reads a task's instruction on stdin, answers through any OpenAI endpoint.

    echo "What is the most famous board game?" | OPENAI_BASE_URL=... OPENAI_API_KEY=... python agent.py

It knows nothing of loops_nb or Harbor. During training, `LoopsProgramAgent` launches it once per
Harbor trial with the two variables set to the run's model gateway and the attempt's lease, and writes
what it prints into the trial's sandbox, where the task's verifier reads it.
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI


def main() -> int:
    instruction = sys.stdin.read().strip()
    client = OpenAI(timeout=120.0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    reply = client.chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        messages=[{"role": "user", "content": instruction}],
    )
    print(reply.choices[0].message.content or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
