"""A loopback server in a process of its own with a low descriptor limit, for the slow-client tests.

    python slow_client_server.py gateway|loops NOFILE [MAX_UNPROVEN [ACCEPT_LOG_SECONDS]]

Prints one JSON line (port, key, the authorization header to send), then serves until stdin closes.
ACCEPT_LOG_SECONDS shortens the interval between 'cannot accept connections' reports (30 s in a run), so a
test sees a second report, with the failures held back since the first, within a few accept rounds.
The low limit makes a modest flood of idle connections enough to exhaust it, as ~20,600 did the
default one; the test's own sockets live in the test process.
"""

from __future__ import annotations

import functools
import json
import resource
import sys
import tempfile
from pathlib import Path

from loops_nb.connection_guard import ConnectionLimits


def main(kind: str, nofile: int, max_unproven: int, accept_log_seconds: float = 0) -> None:
    if accept_log_seconds:
        from loops_nb import loopback_server

        loopback_server.AcceptErrorLog = functools.partial(  # type: ignore[misc]
            loopback_server.AcceptErrorLog, every=accept_log_seconds
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    # Long timeouts: what lets the key through here must be the connection cap, not a timeout.
    limits = ConnectionLimits(header_timeout=600, body_idle_timeout=600, max_unproven=max_unproven)
    if kind == "gateway":
        from loops_nb.model_access import ModelGateway

        gateway = ModelGateway(limits=limits).start()
        lease = gateway.registry.issue("victim/g0/a0", object(), loop=object())  # type: ignore[arg-type]
        port, header = gateway.port, f"Bearer {lease.key}"
        path = "/v1/models"
    else:
        from loops_nb.local.app import build_app
        from loops_nb.local.state import LocalLoopsState
        from loops_nb.loopback_server import LoopbackServer

        state = LocalLoopsState(Path(tempfile.mkdtemp(prefix="slow-client-state-")), device="cpu")
        key = "loops-local-test-key"
        server = LoopbackServer("embedded Loops", limits)
        port = server.start(build_app(state, key), "127.0.0.1", 0)
        header, path = f"Api-Key {key}", "/v1/loops/runs"
    print(json.dumps({"port": port, "authorization": header, "path": path}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]) if len(sys.argv) > 3 else 0,
        float(sys.argv[4]) if len(sys.argv) > 4 else 0,
    )
