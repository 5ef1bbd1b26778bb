"""What the embedded Loops holds: runs (each a LoRA trainer with its op queue), the shared samplers,
and where checkpoints live on disk.

Checkpoint paths are the SDK's URIs mapped onto the state directory (`bt://loops:<run_id>/weights/<name>`,
`.../sampler_weights/<name>`), so a resumed run on a fresh server loads what an earlier one saved.
Absolute paths and `file://` URIs are accepted when they lie inside the state directory.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baseten.loops import CheckpointTarget, LoraAdapterConfig

from loops_nb.errors import UserError
from loops_nb.local.bad_request import BadRequest, RunDeactivated
from loops_nb.local.compute_lane import COMPUTE_LANE
from loops_nb.local.idle_runs import PARKED, IdleRunReaper
from loops_nb.local.local_run import LocalRun
from loops_nb.local.run_records import CheckpointRecord, RunLost, RunRecords

if TYPE_CHECKING:
    from loops_nb.local.sampler import SamplerEngine
    from loops_nb.local.trainer import LoraTrainer

_BT_URI = re.compile(
    r"^bt://loops:(?P<run>[A-Za-z0-9_.-]+)/(?P<kind>weights|sampler_weights)/(?P<name>[^/]+)/?$"
)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")
PUBLISHED_RETENTION = 3  # published sampler weights kept per run (`prune_published`)


def checkpoint_name(name: str) -> str:
    """A checkpoint name that is safe as one path component."""
    if not _SAFE_NAME.match(name) or name in {".", ".."}:
        raise BadRequest(
            f"checkpoint name {name!r}: use 1-128 letters, digits and . _ @ + - (it becomes a folder name)"
        )
    return name


class LocalLoopsState:
    """Runs, samplers and checkpoints of one embedded Loops server."""

    def __init__(
        self,
        state_dir: Path,
        *,
        cache_dir: Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        memory_budget_mb: int | None = None,
        max_batch_sequences: int = 64,
        prefix_cache_mb: int | None = None,
        idle_run_seconds: float | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.cache_dir = cache_dir
        self.device = device
        self.dtype = dtype
        self.memory_budget_mb = memory_budget_mb
        """Bytes (MiB) a trainer micro-batch's activations and the sampler's KV cache may each use."""
        self.max_batch_sequences = max_batch_sequences
        self.prefix_cache_mb = prefix_cache_mb
        """The sampler's prefix cache (MiB; None: as much as its KV budget, 0: off)."""
        from loops_nb.local.model_store import uses_cuda

        COMPUTE_LANE.enabled = not uses_cuda(device)  # a GPU overlaps the trainers' and sampler's work itself
        if COMPUTE_LANE.enabled:
            COMPUTE_LANE.isolate_threads()
        self.runs: dict[str, LocalRun] = {}
        self._samplers: dict[str, SamplerEngine] = {}
        self._model_paths: dict[str, Path] = {}
        self._lock = threading.RLock()
        self.published = threading.Condition(self._lock)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.records = RunRecords(state_dir, instance=uuid.uuid4().hex)
        """Runs and samplers an earlier process on this state directory created (see run_records)."""
        self.reaper = (
            IdleRunReaper(lambda: self.runs.values(), idle_run_seconds) if idle_run_seconds else None
        )
        """Moves idle runs' trainers to disk (`loops serve`); None: runs stay in memory until deactivated."""

    # -- models -------------------------------------------------------------------------------
    def model_path(self, base_model: str) -> Path:
        """The local directory of a base model (resolved once; the offline default is dequantised once)."""
        from loops_nb.local.hf_cache_alias import ensure_hf_cache_alias
        from loops_nb.local.model_store import resolve_model

        with self._lock:
            if base_model not in self._model_paths:
                resolved = resolve_model(base_model, cache_dir=self.cache_dir)
                ensure_hf_cache_alias(resolved)
                self._model_paths[base_model] = resolved.path
            return self._model_paths[base_model]

    def _config(self, base_model: str) -> dict[str, Any]:
        """The model's config.json, its text part merged over it (no weights are loaded; {} if unreadable).

        Resolving the model costs what creating a run on it would (the offline default is dequantised once).
        """
        try:
            config = json.loads((self.model_path(base_model) / "config.json").read_text())
        except (OSError, ValueError, UserError):
            return {}
        return {**config, **(config.get("text_config") or {})}

    def vocab_size(self, base_model: str) -> int | None:
        """The model's vocabulary size."""
        size = self._config(base_model).get("vocab_size")
        return int(size) if size else None

    def max_positions(self, base_model: str) -> int | None:
        """The model's own context length (capabilities' `max_context_length`)."""
        size = self._config(base_model).get("max_position_embeddings")
        return int(size) if size else None

    def max_datum_length(self, run: LocalRun) -> int | None:
        """The longest datum a run's trainer accepts: its max_seq_len, never more than the model's context."""
        limits = [n for n in (run.max_seq_len, self.max_positions(run.base_model)) if n]
        return min(limits) if limits else None

    def is_vision(self, base_model: str) -> bool:
        """Whether the base model is a vision-language model (it then takes image chunks)."""
        return isinstance(self._config(base_model).get("vision_config"), dict)

    def _load[T](self, make: Callable[..., T], base_model: str, **options: object) -> T:
        """`make(model_dir, device=, dtype=, ...)`: a sampler or trainer on the server's device and budget.

        Loaded on the compute lane, so no other thread starts an OpenMP pool (see `compute_lane`)."""
        if not COMPUTE_LANE.on_lane():
            return COMPUTE_LANE.run(lambda: self._load(make, base_model, **options))
        from loops_nb.local.model_store import bf16_products, device_and_dtype, quiet_model_loading

        device, dtype = device_and_dtype(self.device, self.dtype)
        with quiet_model_loading():
            return make(
                self.model_path(base_model),
                device=device,
                dtype=dtype,
                bf16_products=bf16_products(self.dtype),
                memory_budget_mb=self.memory_budget_mb,
                **options,
            )

    def sampler(self, base_model: str) -> SamplerEngine:
        """The shared sampler of a base model; every run's live adapter and checkpoint load into it."""
        with self._lock:
            engine = self._samplers.get(base_model)
        if engine is not None:
            return engine
        # The lane is entered before `_lock`, since a trainer op on the lane may call this and take `_lock`.
        if not COMPUTE_LANE.on_lane():
            return COMPUTE_LANE.run(lambda: self.sampler(base_model))
        from loops_nb.local.sampler import SamplerEngine

        with self._lock:
            if base_model not in self._samplers:
                self._samplers[base_model] = self._load(
                    SamplerEngine,
                    base_model,
                    max_batch_sequences=self.max_batch_sequences,
                    prefix_cache_mb=self.prefix_cache_mb,
                )
            return self._samplers[base_model]

    def sampler_counters(self) -> dict[str, int]:
        """The samplers' prefill counters, summed: `prefill_tokens` computed and `prefix_cached_tokens`
        served from the prefix cache (`local/prefix_cache.py`)."""
        with self._lock:
            engines = list(self._samplers.values())
        return {k: sum(e.stats[k] for e in engines) for k in ("prefill_tokens", "prefix_cached_tokens")}

    def new_trainer(self, run: LocalRun) -> LoraTrainer:
        from loops_nb.local.trainer import LoraTrainer

        return self._load(LoraTrainer, run.base_model, max_seq_len=run.max_seq_len)

    # -- runs ---------------------------------------------------------------------------------
    def create_run(
        self,
        base_model: str,
        lora_rank: int,
        *,
        seed: int | None,
        name: str | None,
        max_seq_len: int | None = None,
    ) -> LocalRun:
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        run = LocalRun(
            id=run_id,
            base_model=base_model,
            lora_rank=lora_rank,
            directory=self.state_dir / "runs" / run_id,
            seed=seed,
            name=name,
            max_seq_len=max_seq_len,
        )
        run.directory.mkdir(parents=True, exist_ok=True)
        self.records.write_run(run_id, base_model, lora_rank, name, run.created_at.isoformat())
        with self._lock:
            self.runs[run_id] = run
        return run

    def run(self, run_id: str, *, active: bool = True) -> LocalRun:
        with self._lock:
            run = self.runs.get(run_id)
        if run is None:
            if self.records.earlier_run(run_id) is not None:
                raise RunLost(run_id)
            raise BadRequest(f"unknown run {run_id!r} (this embedded Loops did not create it)")
        if active and not run.active:
            raise RunDeactivated(run_id)
        return run

    def publish(self, run: LocalRun, version: int) -> None:
        with self.published:
            run.published_version = version
            self.published.notify_all()

    def wait_published(self, run: LocalRun, version: int, timeout: float) -> bool:
        with self.published:
            return self.published.wait_for(lambda: run.published_version >= version, timeout)

    def prune_published(self, run: LocalRun, keep: str) -> None:
        """Delete published sampler weights older than the last `PUBLISHED_RETENTION` ones (RL publishes a
        policy every step, which would fill a laptop's disk; docs/reference/local_loops.md, "Limits")."""
        if keep in run.published_names:
            run.published_names.remove(keep)
        run.published_names.append(keep)
        while len(run.published_names) > PUBLISHED_RETENTION:
            old = run.published_names.pop(0)
            shutil.rmtree(self.checkpoint_dir(run.id, "sampler_weights", old), ignore_errors=True)

    def deactivate(self, run_id: str) -> bool:
        """End a run: its trainer is dropped and its adapter leaves the sampler; checkpoints stay.

        A run lost in a restart has nothing left to end, so deactivating it succeeds and changes nothing.
        """
        try:
            run = self.run(run_id, active=False)
        except RunLost:
            return False
        if not run.active:
            return False
        run.active = False
        run.ops.close()
        run.trainer, run.parked_step = None, None
        shutil.rmtree(run.directory / PARKED, ignore_errors=True)
        engine = self._samplers.get(run.base_model)
        if engine is not None:
            engine.remove_adapter(run.id)
        return True

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint_dir(self, run_id: str, kind: str, name: str) -> Path:
        return self.state_dir / "runs" / run_id / kind / checkpoint_name(name)

    def resolve_checkpoint(self, path: str) -> Path:
        """The directory of a checkpoint: a bt:// URI, or a file:// URI or absolute path inside the state
        directory. Anything outside it is refused: a client may only load what this server saved."""
        match = _BT_URI.match(path)
        if match:
            target = self.checkpoint_dir(match["run"], match["kind"], match["name"])
        elif path.startswith("file://"):
            target = Path(path.removeprefix("file://"))
        elif Path(path).is_absolute():
            target = Path(path)
        else:
            raise BadRequest(
                f"checkpoint path {path!r}: expected bt://loops:<run>/weights/<name>, or a file:// URI or "
                f"absolute path under the state directory {self.state_dir}"
            )
        # resolve(): neither `..` nor a symlink may lead out of the state directory.
        if not target.resolve().is_relative_to(self.state_dir.resolve()):
            raise BadRequest(
                f"checkpoint path {path!r} is outside this server's state directory {self.state_dir}: "
                "give the bt:// path the checkpoint was saved under"
            )
        if not target.is_dir():
            raise BadRequest(f"checkpoint path {path!r}: no checkpoint at {target}")
        return target

    def checkpoint_by_id(self, checkpoint_id: str) -> Path:
        """The directory of the checkpoint whose `Checkpoint.id` (from list_checkpoints) is `checkpoint_id`."""
        for record in self.checkpoints():
            if record.id == checkpoint_id:
                return self.resolve_checkpoint(record.path)
        raise BadRequest(
            f"no checkpoint with id {checkpoint_id!r} on this server; list_checkpoints(run_id) gives the ids"
        )

    def record_checkpoint(self, run: LocalRun, kind: str, name: str) -> str:
        """Note a saved checkpoint for list_checkpoints and return its bt:// path."""
        directory = self.checkpoint_dir(run.id, kind, name)
        record = CheckpointRecord(
            id=f"ckpt-{uuid.uuid4().hex[:12]}",
            run_id=run.id,
            checkpoint_id=name,
            checkpoint_type="lora",
            created_at=datetime.now(UTC),
            base_model=run.base_model,
            lora_adapter_config=LoraAdapterConfig(r=run.lora_rank),
            target=CheckpointTarget.trainer if kind == "weights" else CheckpointTarget.sampler,
            path=f"bt://loops:{run.id}/{kind}/{name}",
            size_bytes=sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()),
        )
        (directory / "checkpoint.json").write_text(record.model_dump_json(by_alias=True))
        return record.path

    def checkpoints(
        self, *, run_id: str | None = None, checkpoint_path: str | None = None
    ) -> list[CheckpointRecord]:
        """Checkpoint records from disk, oldest first, filtered by run or by path."""
        found = []
        for meta in sorted((self.state_dir / "runs").glob("*/*/*/checkpoint.json")):
            try:
                record = CheckpointRecord.model_validate_json(meta.read_text())
            except (OSError, ValueError):
                continue
            if run_id is not None and record.run_id != run_id:
                continue
            if checkpoint_path is not None and record.path != checkpoint_path.rstrip("/"):
                continue
            found.append(record)
        return sorted(found, key=lambda r: r.created_at)

    def close(self) -> None:
        if self.reaper is not None:
            self.reaper.close()
        with self._lock:
            runs = list(self.runs.values())
            samplers = list(self._samplers.values())
            self._samplers.clear()
        for run in runs:
            if run.active:
                run.ops.close()
        for engine in samplers:
            engine.close()
