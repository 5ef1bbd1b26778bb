"""The SFT training loop on the shared run skeleton (`loops_nb.run.recipe_run`): per planned batch one
cross-entropy `forward_backward` and one `optim_step` at the schedule's rate, and the held-out loss before the
first step, every `eval_every` steps and at the end.

Resuming is exact because the plan is a pure function of the data and the config: the steps a checkpoint
keeps must have trained the batches the plan gives them now (`check_plan`), or the run is refused
(docs/reference/sft.md#resume-every-optimizer-step-exactly-once).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.observers import ObserverSet
from loops_nb.run.recipe_run import RecipeRun
from loops_nb.run_dir import Checkpoint, JsonlLog, RunDirectory
from loops_nb.run_events import EvalRecord, StepRecord
from loops_nb.sft.batching import BatchPlan, SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.evaluation import EvalResult, example_datum, held_out_loss, weighted_nll
from loops_nb.sft.outcome import SFTOutcome
from loops_nb.sft.targets import Example

if TYPE_CHECKING:
    from baseten.loops import TrainingClient


class SFTRun(RecipeRun):
    """The SFT recipe's steps: the plan's batch, one cross-entropy step, held-out evaluations."""

    outcome_type = SFTOutcome

    def __init__(
        self,
        config: SFTConfig,
        run_dir: RunDirectory,
        training_client: TrainingClient,
        data: SFTData,
        observers: ObserverSet,
        *,
        stop: asyncio.Event | None = None,
    ) -> None:
        t = config.training
        super().__init__(
            run_dir,
            training_client,
            observers,
            total_steps=data.plan.total_steps,
            save_every=t.save_every,
            stop=stop,
        )
        self.config = config
        self.data = data
        self.evals = JsonlLog(run_dir.root / "evals.jsonl")
        self._eval_examples: list[Example] = []

    def rewind(self, step: int) -> None:
        super().rewind(step)
        self.evals.keep(lambda r: r.get("step", 0) <= step)

    def start_over(self) -> None:
        super().start_over()
        self.evals.keep(lambda r: False)

    async def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        await super().load_checkpoint(checkpoint)
        check_plan(self.run_dir, self.data.plan, up_to=checkpoint.step)

    async def begin(self, start: int) -> None:
        self._eval_examples = await asyncio.to_thread(self.data.eval_examples)
        logged_before = any(r.get("step") == 0 for r in self.evals.records())
        if not logged_before and start == 0 and self._eval_examples:
            before = await self._evaluate(0)
            # No step record carries it: observers (a live loss chart's first eval point) get it here.
            self.observers.emit(EvalRecord(0, before.record()))

    async def when_stopped(self, step: int, start: int, metrics: dict[str, Any]) -> dict[str, Any]:
        # A completed run evaluated with its last step; a stopped one is measured where it stopped.
        if not self._eval_examples:
            return metrics
        return {**metrics, **(await self._evaluate(step)).record()}

    async def train_step(self, step: int) -> StepRecord:
        step_started = time.perf_counter()
        batch = self.data.plan.batch(step)
        examples = await asyncio.to_thread(self.data.train.load, batch.indices, self.data.targets)
        lr = self.config.training.rate(step, self.data.plan.total_steps)
        fb = await self.trainer.forward_backward_async(
            [example_datum(e) for e in examples], loss_fn="cross_entropy"
        )
        out = await fb.result_async()
        optim = await self.trainer.optim_step_async(self.config.training.adam_params(lr))
        optim_out = await optim.result_async()
        nll, weight = weighted_nll(examples, out.loss_fn_outputs)
        record: dict[str, Any] = {
            "epoch": batch.epoch,
            "loss": nll / weight if weight else 0.0,
            "learning_rate": lr,
            "tokens/trained": sum(e.n_trained for e in examples),
            "tokens/total": sum(e.n_tokens for e in examples),
            "examples": len(examples),
            "batch": self.data.plan.batch_id(step),
        }
        grad_norm = (getattr(optim_out, "metrics", None) or {}).get("grad_norm")
        if isinstance(grad_norm, int | float):
            record["optim/grad_norm"] = float(grad_norm)
        record["time/step_s"] = round(time.perf_counter() - step_started, 3)
        every = self.config.training.eval_every
        last = step + 1 == self.data.plan.total_steps
        if self._eval_examples and (last or (every and (step + 1) % every == 0)):
            record.update((await self._evaluate(step + 1)).record())
        return StepRecord(step, record, time=time.time())

    async def _evaluate(self, steps_applied: int) -> EvalResult:
        started = time.perf_counter()
        result = await held_out_loss(self.trainer, self._eval_examples, self.config.training.batch_tokens)
        self.evals.append(
            {
                "step": steps_applied,
                **result.record(),
                "time/eval_s": round(time.perf_counter() - started, 3),
                "time": time.time(),
            }
        )
        return result


def check_plan(run_dir: RunDirectory, plan: BatchPlan, up_to: int | None = None) -> None:
    """Refuse a run whose logged steps (those before ``up_to``) trained other batches than the plan gives them
    now: resuming it, or reporting it as complete, would be another run's."""
    for record in run_dir.steps.records():
        step = record["step"]
        if up_to is not None and step >= up_to:
            continue  # past the checkpoint: cut by the rewind, redone from the plan
        if record.get("batch") != plan.batch_id(step):
            raise UserError(
                f"{run_dir.root}: step {step} trained batch {record.get('batch')}, but the data and "
                f"config now plan batch {plan.batch_id(step)} for it (the data files, data.*, batch_tokens or "
                "epochs changed); resuming would replay or skip examples. Use a new output.run_name."
            )
