"""What the embedded Loops answers for a route it does not serve: a JSON error that says so, never a bare 404.

A bare 404 is the worst answer a Loops client can get: the SDK retries 404 for up to an hour (bl/retry.py),
and the body says nothing about why. So every route without a local meaning is answered 422 (raised at
once) in the SDK's error shape (`{"detail": ...}`, which `raise_for_status_with_details` prints), naming the
route and what to do instead. Routes the SDK knows but that make no sense locally get a specific reason;
anything else gets the generic one.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

NOT_SERVED_STATUS = 422
"""Not 404 or 501: the SDK retries 404, and raises a 422 at once with its message."""

_KNOWN_UNSERVED: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"^/v1/teams(/|$)"),
        "teams are a Baseten workspace concept; the local Loops has one implicit team. "
        "Create the ServiceClient without team=",
    ),
    (
        re.compile(r"^/v1/loops/debug/"),
        "the internal debug route (scope=, internal backend version) picks Baseten capacity; "
        "create the client without scope= (or unset BASETEN_LOOPS_SCOPE)",
    ),
    (
        re.compile(r"^/samplers/[^/]+/wake$"),
        "a local sampler never scales to zero, so there is nothing to wake",
    ),
]


def unserved_reason(path: str) -> str:
    for pattern, reason in _KNOWN_UNSERVED:
        if pattern.match(path):
            return reason
    return "no such route in the Loops API this server implements (baseten-loops 0.32); see docs/reference/local_loops.md"


async def not_served(request: Request, exc: Exception) -> Response:
    """The app's handler of Starlette's 404 and 405: the answer to every path or method it does not serve."""
    route = f"{request.method} {request.url.path}"
    return JSONResponse(
        {"detail": f"{route} is not served by the local Loops: {unserved_reason(request.url.path)}"},
        status_code=NOT_SERVED_STATUS,
    )
