"""Reading a JSON request body on a loopback server: size-limited while it streams, every bad body a 4xx.

The limit is checked as chunks arrive, so a chunked body is refused at the limit, not after being read
whole; JSON Python cannot parse for any reason (syntax, bad UTF-8, nesting, a 4300-digit integer) is the
caller's mistake, never a server error. The embedded Loops and the model gateway both read bodies here.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from loops_nb.errors import LoopsNbError


class BodyRefused(LoopsNbError):
    """The body cannot be accepted; the message says why, for the client."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


async def read_limited(request: Request, limit: int) -> bytes:
    """The request's body, or BodyRefused as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise BodyRefused(f"Content-Length {declared[:40]!r} is not a number of bytes")
        if int(declared) > limit:
            raise BodyRefused(
                f"the request body of {declared} bytes is over the {limit} byte limit", too_large=True
            )
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise BodyRefused(f"the request body is over {limit} bytes", too_large=True)
    except ClientDisconnect:
        # Gone mid-body (or dropped by the ConnectionGuard for stalling): nobody reads the answer.
        raise BodyRefused("the client closed the connection before the whole body arrived") from None
    return bytes(data)


def parse_json(raw: bytes) -> Any:
    """`raw` decoded as JSON, or BodyRefused naming what is wrong with it."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise BodyRefused("the request body is not valid JSON: it is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError is a ValueError, and so is an integer too long to convert.
        raise BodyRefused(f"the request body is not valid JSON: {exc}") from None
