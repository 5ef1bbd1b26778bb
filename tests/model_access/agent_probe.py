"""An agent program that looks for what it should not have: run by the agent-isolation tests.

    python agent_probe.py [GATEWAY_STEAL]

Prints one JSON object: its own lease key, every `OPENAI_API_KEY` it finds in any `/proc/<pid>/environ`
it can read (a sibling attempt's key among them is a stolen lease), the whole of its parent's environment,
and, with GATEWAY_STEAL, the status of a gateway call made with each foreign key it found.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


def environ_of(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def call_gateway(key: str) -> int:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "steal"}]}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def main(steal: bool) -> None:
    own = os.environ["OPENAI_API_KEY"]
    pids = [p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())]
    keys = {environ_of(p).get("OPENAI_API_KEY") for p in pids} - {None}
    foreign = sorted(k for k in keys if k != own)  # type: ignore[type-var]
    report = {
        "own_key": own,
        "foreign_keys": foreign,
        "parent_environ": environ_of(str(os.getppid())),
        "own_environ": dict(os.environ),
        "stolen_calls": {k: call_gateway(k) for k in foreign} if steal else {},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(len(sys.argv) > 1 and sys.argv[1] == "GATEWAY_STEAL")
