"""Per-attempt leases: the API key an out-of-process agent uses, valid only while its attempt runs.

A lease binds a random key to one attempt's `LoopsLLM` and to the event loop the attempt runs on (the
gateway serves on its own thread and hands each call to that loop, so the SDK's async clients and the
capture are only ever touched there). Revoking removes the key: later requests are refused, so a
straggling agent can never add tokens to an attempt that has already been scored.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.llm.chat_messages import ChatMessage
    from loops_nb.llm.client import LoopsLLM

KEY_PREFIX = "loops-lease-"


@dataclass
class ReturnedReply:
    """An assistant message the gateway handed out, and the exact text its sampled tokens decode to."""

    content: str
    tool_calls: list[tuple[str, Any]]
    exact_text: str


@dataclass
class AttemptLease:
    key: str
    attempt_id: str
    llm: LoopsLLM
    loop: asyncio.AbstractEventLoop
    returned: list[ReturnedReply] = field(default_factory=list)
    """Replies of this lease, so a conversation sent back keeps the exact sampled text (see gateway)."""
    truncated: str | None = None
    """Set when a call no longer fit max_seq_len: the attempt is discarded as truncated."""
    calls: int = 0
    revoked: bool = False
    """Set on revocation: a request already accepted does not sample after its attempt ended."""
    inflight: dict[asyncio.Task[Any], str] = field(default_factory=dict)
    """This lease's requests on the attempt's loop, each `sampling` or `delivering` (delivery.py)."""
    responses: dict[str, list[ChatMessage]] = field(default_factory=dict)
    """Delivered Responses API replies by id: their conversation, for a later `previous_response_id`."""
    _lock: asyncio.Lock | None = None

    def lock(self) -> asyncio.Lock:
        """Serialises this attempt's model calls (on its own loop), so each reads back its own capture."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


class LeaseRegistry:
    """The live leases of a run, shared between the attempts' loop and the gateway's thread."""

    def __init__(self) -> None:
        self._leases: dict[str, AttemptLease] = {}
        self._guard = threading.Lock()

    def issue(
        self, attempt_id: str, llm: LoopsLLM, loop: asyncio.AbstractEventLoop | None = None
    ) -> AttemptLease:
        """A fresh lease for an attempt; call from the attempt's loop (or pass it)."""
        lease = AttemptLease(
            key=KEY_PREFIX + secrets.token_urlsafe(24),
            attempt_id=attempt_id,
            llm=llm,
            loop=loop if loop is not None else asyncio.get_running_loop(),
        )
        with self._guard:
            self._leases[lease.key] = lease
        return lease

    def revoke(self, key: str) -> AttemptLease | None:
        """End a lease; returns it (None if it was unknown or already revoked)."""
        with self._guard:
            lease = self._leases.pop(key, None)
        if lease is not None:
            lease.revoked = True
        return lease

    def get(self, key: str) -> AttemptLease | None:
        """The live lease with this key; None for an unknown or revoked one."""
        with self._guard:
            return self._leases.get(key)

    def __len__(self) -> int:
        with self._guard:
            return len(self._leases)
