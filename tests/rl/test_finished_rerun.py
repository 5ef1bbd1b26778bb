"""Rerunning a finished RL run is free: it is answered from the run directory, with no Loops client, and
run.json (its run_id above all) is left as it was."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from loops_nb import load
from loops_nb.compute import LoopsConnection

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "patterns" / "custom_runtime" / "in_process_direct" / "train_local.toml"


async def test_a_finished_rl_run_rerun_starts_no_loops_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    project = load(CONFIG, overrides={"output.output_dir": str(tmp_path), "output.run_name": "done"})
    steps = project.config.training.max_steps
    run = tmp_path / "done"
    run.mkdir()
    # What a finished run leaves: every step logged, and a final checkpoint with the sampler weights.
    (run / "run.json").write_text(json.dumps({"recipe": "rl", "run_id": "first", "run_ids": ["first"]}))
    (run / "steps.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in range(steps))
    )
    final = {"step": steps, "path": "bt://loops:first/weights/state", "sampler_path": "bt://loops:first/s"}
    (run / "checkpoints.jsonl").write_text(json.dumps(final) + "\n")
    before = (run / "run.json").read_text()

    async def no_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished run needs no Loops connection")

    monkeypatch.setattr(LoopsConnection, "open", no_client)
    with caplog.at_level(logging.WARNING):
        outcome = await project.train(observers=[])
    assert outcome.status == "completed" and outcome.steps == outcome.start_step == steps
    assert (outcome.checkpoint, outcome.sampler_path) == (final["path"], final["sampler_path"])
    assert outcome.last_metrics == {"step": steps - 1, "loss": 0.5}
    assert (run / "run.json").read_text() == before
    assert f"{run} is already complete: {steps} steps" in caplog.text
    assert "already complete" in (run / "run.log").read_text()
