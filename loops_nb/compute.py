"""Reaching Loops for a config's `[compute] scope`: the same SDK calls on every scope.

`local` starts (or joins) an embedded Loops and talks to it through `ServiceClient(base_url=...)`;
`serverless` and `dedicated` go to Baseten with BASETEN_API_KEY. Nothing here is scope-specific past
choosing the URL, the key and the deployment options, so the local path is the production path.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.config.sections import ComputeConfig
from loops_nb.errors import CredentialsError, UserError

if TYPE_CHECKING:
    from baseten.loops import ServiceClient, TrainingClient

    from loops_nb.local.embedded import EmbeddedLoops

log = logging.getLogger(__name__)

BASETEN_URL = "https://api.baseten.co"

LOCAL_SERVER_READY_TIMEOUT_SECONDS = 600.0
"""How long the SDK waits on a `loops serve` that stopped answering before a call fails.

The SDK's default hour is sized for Baseten cold starts; a dead local server would stall a run for hours.
The bound also caps one trainer op from submit to result, so it is minutes. The embedded server lives in
the run's process and cannot vanish alone, so it keeps the SDK default.
"""


def _quiet_sdk_hint(record: logging.LogRecord) -> bool:
    """A log filter dropping the SDK's hint to turn on INFO logs, printed by every ServiceClient in a notebook
    or CLI whose logging is not at INFO; loops_nb reports the run's lifecycle itself."""
    return "set the log level to INFO" not in record.getMessage()


def require_api_key(scope: str) -> str:
    key = os.environ.get("BASETEN_API_KEY")
    if not key:
        raise CredentialsError(
            f'compute.scope = "{scope}" needs BASETEN_API_KEY: put it in a .env beside the config or in '
            'the working directory, or export it (or use compute.scope = "local" to run on this machine)'
        )
    return key


@dataclass
class LoopsConnection:
    """An SDK `ServiceClient` for one scope, plus the embedded server it owns on the local scope."""

    scope: str
    compute: ComputeConfig
    service: ServiceClient
    base_url: str
    api_key: str
    embedded: EmbeddedLoops | None = None
    runs: list[str] = field(default_factory=list)
    ready_timeout: float | None = None
    """The SDK's retry window for this connection's clients; None keeps the SDK's default."""

    @classmethod
    async def open(cls, compute: ComputeConfig, *, state_dir: Path | None = None) -> LoopsConnection:
        """Connect for `compute.scope`; on the local scope start an embedded Loops unless
        compute.base_url (or LOOPS_BASE_URL) names a running `loops serve`."""
        from baseten.loops import ServiceClient

        embedded = None
        ready_timeout = None
        if compute.scope == "local":
            base_url = compute.base_url or os.environ.get("LOOPS_BASE_URL")
            if base_url:
                api_key = os.environ.get("BASETEN_API_KEY", "")
                ready_timeout = LOCAL_SERVER_READY_TIMEOUT_SECONDS
            else:
                from loops_nb.local.embedded import EmbeddedLoops

                # Every `[compute.local]` key is an `EmbeddedLoops` option of the same name.
                embedded = EmbeddedLoops(state_dir=state_dir, **compute.local.model_dump())
                await embedded.astart()
                base_url, api_key = embedded.url, embedded.api_key
        else:
            api_key = require_api_key(compute.scope)
            base_url = compute.base_url or os.environ.get("LOOPS_BASE_URL") or BASETEN_URL
        kwargs: dict[str, Any] = {"base_url": base_url, "api_key": api_key or None}
        if compute.scope == "dedicated":
            if compute.spot:
                kwargs["availability_model"] = "spot"
            if compute.reuse:
                kwargs["reuse_from_run_id"] = compute.reuse
        logging.getLogger("baseten.loops.service_client").addFilter(_quiet_sdk_hint)
        try:
            service = await asyncio.to_thread(lambda: ServiceClient(**kwargs))
        except Exception:
            if embedded is not None:
                await embedded.astop()
            raise
        return cls(compute.scope, compute, service, base_url, api_key, embedded, ready_timeout=ready_timeout)

    async def training_client(
        self, base_model: str, *, rank: int, seed: int | None = None, max_seq_len: int | None = None
    ) -> TrainingClient:
        """A fresh LoRA training client; on serverless, refuse a run that came back dedicated."""
        kwargs: dict[str, Any] = {"base_model": base_model, "rank": rank, "seed": seed}
        if self.ready_timeout is not None:
            # Its paired sampling clients inherit it: a sample retries the server no longer than this.
            kwargs["ready_timeout"] = self.ready_timeout
        if self.scope != "local":
            kwargs["max_seq_len"] = max_seq_len
        if self.scope == "dedicated":
            kwargs["replicas"] = self.compute.replicas or 1
            if self.compute.sampler_replicas:
                kwargs["sampler_num_replicas"] = self.compute.sampler_replicas
        tc = await asyncio.to_thread(lambda: self.service.create_lora_training_client(**kwargs))
        if tc.run_id:
            self.runs.append(tc.run_id)
        if self.scope == "serverless" and type(tc._deployment).__name__ == "DedicatedTrainerDeployment":
            await self.deactivate(tc.run_id or "")
            raise UserError(
                f"Loops created a dedicated deployment for {base_model}, which has no serverless pool in "
                'this workspace; compute.scope = "serverless" never falls back to a billed deployment, so '
                'run was deactivated. Use compute.scope = "dedicated" to train this model.'
            )
        return tc

    async def deactivate(self, run_id: str) -> None:
        await asyncio.to_thread(deactivate_run, run_id, self.base_url, self.api_key)

    def sampler_counters(self) -> dict[str, int] | None:
        """The embedded Loops' prefill counters (None for a remote Loops, which does not report them)."""
        return self.embedded.state.sampler_counters() if self.embedded is not None else None

    async def close(self, *, keep_runs: bool | None = None) -> None:
        """Close the connection; a dedicated run is deactivated unless compute.keep_run."""
        keep = self.compute.keep_run if keep_runs is None else keep_runs
        if self.scope == "dedicated" and not keep:
            for run_id in self.runs:
                await self.deactivate(run_id)
        if self.embedded is not None:
            await self.embedded.astop()


def deactivate_run(run_id: str, base_url: str, api_key: str | None) -> None:
    """End a Loops run (and its paired sampler); its checkpoints stay."""
    import httpx

    headers = {"Authorization": f"Api-Key {api_key}"} if api_key else {}
    try:
        resp = httpx.post(
            f"{base_url.rstrip('/')}/v1/loops/runs/{run_id}/deactivate", headers=headers, timeout=60
        )
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach Loops at {base_url} to deactivate {run_id}: {exc}") from None
    if resp.status_code >= 400:
        detail = resp.text[:300]
        raise UserError(f"deactivating {run_id} failed ({resp.status_code}): {detail}")
