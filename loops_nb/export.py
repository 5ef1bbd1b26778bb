"""`loops export`: a run's LoRA adapter, or the base model with the adapter merged in, as a directory other tools
load (how to call it, what each holds and loads with: docs/reference/after_training.md).

The checkpoint's files come through the SDK's `download_checkpoint` on every scope. The target is written whole
or not at all: everything goes to a hidden temporary directory beside it, renamed to the target when complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loops_nb.errors import UserError
from loops_nb.saved_run import RunCheckpoint, SavedRun

EXPORT_RECORD = "loops_export.json"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    checkpoint: RunCheckpoint
    merged: bool
    base_model: str

    def describe(self) -> list[str]:
        what = "merged model" if self.merged else "PEFT adapter"
        return [
            f"exported: {what} of {self.checkpoint.describe()}",
            f"to: {self.directory}",
            f"base model: {self.base_model}",
            (
                f"load: AutoModelForCausalLM.from_pretrained({str(self.directory)!r})"
                if self.merged
                else f"load: PeftModel.from_pretrained(base, {str(self.directory)!r})"
            ),
        ]


def _check_target(target: Path) -> None:
    if target.exists():
        raise UserError(
            f"--to {target}: already exists; export writes a new directory (remove it or pick another)"
        )
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UserError(f"--to {target}: {parent} is a file")


async def _download_adapter(run: SavedRun, checkpoint: RunCheckpoint, into: Path) -> Path:
    """The checkpoint's adapter files under ``into`` (through the SDK); returns the adapter's directory."""
    connection = await run.connect()
    try:
        target = "sampler" if checkpoint.kind == "sampler" else "trainer"
        download = await asyncio.to_thread(
            lambda: connection.service.download_checkpoint(
                name=checkpoint.name, run_id=checkpoint.loops_run_id, target=target, dest_dir=str(into)
            )
        )
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot fetch {checkpoint.describe()} from Loops: {exc}") from None
    finally:
        await connection.close(keep_runs=True)
    root = Path(download.dest_dir)
    for candidate in (root, root / "adapter"):
        if all((candidate / f).is_file() for f in ADAPTER_FILES):
            return candidate
    raise UserError(f"{checkpoint.describe()}: its files hold no PEFT adapter ({', '.join(ADAPTER_FILES)})")


def _write_adapter(adapter: Path, out: Path, base_model: str) -> None:
    out.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copy2(adapter / name, out / name)
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    # The trainer wrote the path it loaded the base from (a cache directory); the config's name travels.
    config["base_model_name_or_path"] = base_model
    config["inference_mode"] = True
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _write_merged(run: SavedRun, adapter: Path, out: Path, dtype: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from loops_nb.local.model_store import quiet_model_loading, resolve_model

    base_path = resolve_model(run.model.base_model, cache_dir=run.compute.local.cache_dir).path
    torch_dtype: str | torch.dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    with quiet_model_loading():
        try:
            base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch_dtype)
        except (ValueError, OSError) as exc:
            raise UserError(
                f"--merged: AutoModelForCausalLM cannot load the base model {run.model.base_model} ({exc}); "
                "export the adapter instead (without --merged)"
            ) from None
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.config.name_or_path = run.model.base_model
    merged.save_pretrained(str(out), safe_serialization=True)


def _write_tokenizer(run: SavedRun, out: Path) -> None:
    from loops_nb.model_renderer import load_model_tokenizer

    tokenizer = load_model_tokenizer(run.model, run.compute.scope, cache_dir=run.compute.local.cache_dir)
    tokenizer.save_pretrained(str(out))


async def export_run(
    run_dir: str | os.PathLike[str],
    to: str | os.PathLike[str],
    *,
    checkpoint: str | int = "latest",
    merged: bool = False,
    dtype: str = "auto",
) -> ExportResult:
    """Export ``checkpoint`` of the run at ``run_dir`` to the new directory ``to`` (see the module doc)."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    target = Path(to).expanduser()
    _check_target(target)
    run = SavedRun.open(run_dir)
    chosen = run.checkpoint(checkpoint)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        adapter = await _download_adapter(run, chosen, work / "download")
        staged = work / "export"
        if merged:
            staged.mkdir()
            await asyncio.to_thread(_write_merged, run, adapter, staged, dtype)
        else:
            _write_adapter(adapter, staged, run.model.base_model)
        await asyncio.to_thread(_write_tokenizer, run, staged)
        record = {
            "run_dir": str(run.root.resolve()),
            "checkpoint": chosen.path,
            "kind": chosen.kind,
            "step": chosen.step,
            "base_model": run.model.base_model,
            "merged": merged,
            "dtype": dtype if merged else None,
            "exported": time.time(),
        }
        (staged / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        try:
            # A rename within one directory: the target appears complete, or not at all.
            os.rename(staged, target)
        except OSError as exc:
            raise UserError(f"--to {target}: cannot create it ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ExportResult(target, chosen, merged, run.model.base_model)
