"""The SFT training loop: one forward_backward and one optim_step per planned batch, evaluation,
checkpoints, logs, and an exact resume.

Per step ``s`` (0-based): the batch ``plan.batch(s)`` is rebuilt from the data files, trained with
``cross_entropy`` (token weights from the target rule), and one ``optim_step`` applies it with the learning
rate of step ``s``. ``steps.jsonl`` gets one record per optimizer step, with the batch's identity (a hash of its
example ids) so two runs can be compared step by step. Every ``eval_every`` steps, before the first step and at
the end, the held-out loss is measured (forward only). Every ``save_every`` steps and at the end the trainer
state is saved (``checkpoints.jsonl``); at the end also the sampler weights.

Exactly-once: a checkpoint at ``k`` means steps ``0..k-1`` were applied. A resumed run loads it with the
optimizer state, cuts the logs back to it (``RunDirectory.rewind_to``), checks that the steps it keeps trained
the batches the plan gives now, and continues at step ``k``. Since the plan is a pure function of the data and
the config, no batch is replayed or skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from loops_nb.errors import UserError
from loops_nb.observers import ObserverSet
from loops_nb.rl.loop import Outcome
from loops_nb.rl.policy import AdamSettings
from loops_nb.run_dir import Checkpoint, JsonlLog, RunDirectory
from loops_nb.sft.batching import SFTData, batch_id
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.evaluation import EvalResult, example_datum, held_out_loss, weighted_nll
from loops_nb.sft.rendering import Example
from loops_nb.sft.schedule import learning_rate

log = logging.getLogger(__name__)


@dataclass
class SFTOutcome(Outcome):
    """What an SFT run did; ``eval_loss_before`` is the held-out loss before the first step."""

    eval_loss_before: float | None = None
    eval_loss: float | None = None

    def describe(self) -> list[str]:
        lines = super().describe()
        if self.eval_loss is not None:
            before = f"{self.eval_loss_before:.4g} -> " if self.eval_loss_before is not None else ""
            lines.append(f"held-out loss: {before}{self.eval_loss:.4g}")
        return lines


class SFTRun:
    def __init__(
        self,
        config: SFTConfig,
        run_dir: RunDirectory,
        training_client: Any,
        data: SFTData,
        observers: ObserverSet,
        *,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.tc = training_client
        self.data = data
        self.observers = observers
        self.stop = stop or asyncio.Event()
        t = config.training
        self.adam = AdamSettings.of(t)
        self.evals = JsonlLog(run_dir.root / "evals.jsonl")
        self._eval_examples: list[Example] = []

    def lr(self, step: int) -> float:
        t = self.config.training
        return learning_rate(
            step,
            total_steps=self.data.plan.total_steps,
            peak=t.learning_rate,
            schedule=t.lr_schedule,
            warmup_steps=t.warmup_steps,
        )

    async def resume_point(self) -> int:
        """Load the last checkpoint (with the optimizer) and cut the logs back to it; 0 for a fresh run."""
        checkpoint = self.run_dir.last_checkpoint()
        if checkpoint is None:
            # Killed before its first checkpoint: the fresh trainer starts over, so must the logs.
            self.run_dir.rewind_to(0)
            self.evals.keep(lambda r: False)
            return 0
        plan = self.data.plan
        if checkpoint.step > plan.total_steps:
            raise UserError(
                f"{self.run_dir.root} has a checkpoint at step {checkpoint.step}, past the {plan.total_steps} steps "
                "this config plans; use a new output.run_name (or raise training.max_steps / epochs)"
            )
        future = await self.tc.load_state_with_optimizer_async(checkpoint.path)
        await future.result_async()
        self.run_dir.rewind_to(checkpoint.step)
        self.evals.keep(lambda r: r.get("step", 0) <= checkpoint.step)
        self._check_plan()
        log.info("resuming %s at step %d from %s", self.run_dir.root, checkpoint.step, checkpoint.path)
        return checkpoint.step

    async def execute(self, start: int) -> SFTOutcome:
        t = self.config.training
        plan = self.data.plan
        started = time.monotonic()
        self._eval_examples = await asyncio.to_thread(self.data.eval_examples)
        before = next((r["eval/loss"] for r in self.evals.records() if r.get("step") == 0), None)
        if before is None and start == 0 and self._eval_examples:
            before = (await self._evaluate(0)).loss
        status, metrics, step = "completed", {}, start
        try:
            for batch in plan.batches(start):
                if self.stop.is_set():
                    status = "stopped"
                    break
                metrics = await self._train_step(batch.step, batch.epoch, batch.indices)
                step = batch.step + 1
                if t.save_every and step % t.save_every == 0 and step < plan.total_steps:
                    await self._checkpoint(step, sampler=False)
            else:
                step = plan.total_steps
        except Exception as exc:
            raise self.run_dir.record_failure(step, exc) from exc
        if status == "stopped" and self._eval_examples and step > start:
            # A completed run evaluated with its last step; a stopped one is measured where it stopped.
            metrics = {**metrics, **(await self._evaluate(step)).record()}
        checkpoint = await self._checkpoint(step, sampler=True)
        return self._outcome(status, step, start, checkpoint, started, before, metrics)

    def _check_plan(self) -> None:
        """Refuse a run whose logged steps trained other batches than the plan gives them now."""
        plan = self.data.plan
        for record in self.run_dir.steps.records():
            step = record["step"]
            if record.get("batch") != plan.batch_id(step):
                raise UserError(
                    f"{self.run_dir.root}: step {step} trained batch {record.get('batch')}, but the data and "
                    f"config now plan batch {plan.batch_id(step)} for it (the data files, data.*, batch_tokens or "
                    "epochs changed); resuming would replay or skip examples. Use a new output.run_name."
                )

    def finished(self, checkpoint: Checkpoint) -> SFTOutcome:
        """The outcome of a run whose files show it complete (``checkpoint``: its final one), read from them:
        nothing is trained, evaluated or saved, and no training client is needed. Its steps must still be the
        plan's, as on a resume: a changed plan is refused, not reported as this run."""
        self._check_plan()
        before = next((r["eval/loss"] for r in self.evals.records() if r.get("step") == 0), None)
        step = checkpoint.step
        return self._outcome("completed", step, step, checkpoint, time.monotonic(), before)

    def _outcome(
        self,
        status: str,
        step: int,
        start: int,
        checkpoint: Checkpoint,
        started: float,
        before: float | None,
        metrics: dict[str, Any] | None = None,
    ) -> SFTOutcome:
        if metrics is None:
            metrics = self.run_dir.last_step_record()
        last_eval = next(iter(reversed(list(self.evals.records()))), None)
        outcome = SFTOutcome(
            run_dir=str(self.run_dir.root),
            status=status,
            steps=step,
            start_step=start,
            last_metrics=metrics,
            checkpoint=checkpoint.path,
            sampler_path=checkpoint.sampler_path,
            seconds=time.monotonic() - started,
            eval_loss_before=before,
            eval_loss=last_eval["eval/loss"] if last_eval else None,
        )
        self.observers.emit("on_end", {"status": status, "steps": step, "seconds": outcome.seconds})
        return outcome

    async def _train_step(self, step: int, epoch: int, indices: tuple[int, ...]) -> dict[str, Any]:
        step_started = time.perf_counter()
        examples = await asyncio.to_thread(self.data.train.load, indices, self.data.renderer)
        lr = self.lr(step)
        fb = await self.tc.forward_backward_async(
            [example_datum(e) for e in examples], loss_fn="cross_entropy"
        )
        out = await fb.result_async()
        optim = await self.tc.optim_step_async(self.adam.params(lr))
        optim_out = await optim.result_async()
        nll, weight = weighted_nll(examples, out.loss_fn_outputs)
        record: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "loss": nll / weight if weight else 0.0,
            "learning_rate": lr,
            "tokens/trained": sum(e.n_trained for e in examples),
            "tokens/total": sum(e.n_tokens for e in examples),
            "examples": len(examples),
            "batch": batch_id(self.data.train, indices),
        }
        for key, value in (getattr(optim_out, "metrics", None) or {}).items():
            if key == "grad_norm" and isinstance(value, int | float):
                record["optim/grad_norm"] = float(value)
        record["time/step_s"] = round(time.perf_counter() - step_started, 3)
        every = self.config.training.eval_every
        last = step + 1 == self.data.plan.total_steps
        if self._eval_examples and (last or (every and (step + 1) % every == 0)):
            record.update((await self._evaluate(step + 1)).record())
        record["time"] = time.time()
        self.run_dir.steps.append(record)
        self.observers.emit("on_step", record)
        return record

    async def _evaluate(self, steps_applied: int) -> EvalResult:
        started = time.perf_counter()
        result = await held_out_loss(self.tc, self._eval_examples, self.config.training.batch_tokens)
        self.evals.append(
            {
                "step": steps_applied,
                **result.record(),
                "time/eval_s": round(time.perf_counter() - started, 3),
                "time": time.time(),
            }
        )
        return result

    async def _checkpoint(self, step: int, *, sampler: bool) -> Checkpoint:
        future = await self.tc.save_state_async(f"state-{step:06d}")
        path = str((await future.result_async()).path)
        sampler_path = None
        if sampler:
            future = await self.tc.save_weights_for_sampler_async(f"final-{step:06d}")
            sampler_path = str((await future.result_async()).path)
        checkpoint = Checkpoint(step=step, path=path, sampler_path=sampler_path)
        self.run_dir.record_checkpoint(checkpoint)
        return checkpoint
