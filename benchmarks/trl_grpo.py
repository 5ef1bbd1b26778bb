"""The kit against TRL's GRPOTrainer on the quickstart's task: CPU seconds to a step's mean reward >= 0.7,
seeds 0, 1 and 2, both measured in the same run (issue 35, "Benchmarks", third bullet; aim <= 0.3x TRL).

    uv run --all-extras --group bench python -m benchmarks trl_grpo

(`--group bench` adds TRL, which neither the dev group nor --all-extras installs; `--all-extras` keeps the
shared environment's extras installed while it syncs.)

For each seed the kit's quickstart (patterns/custom_runtime/in_process_direct/train_local.toml, loaded and
trained as `quickstart_runs.run_quickstart` does, with its `StepClock`) and TRL's `GRPOTrainer` each run in a
fresh Python process, one after the other, never at once. Each process stamps the end of every optimizer
step with its wall seconds, its CPU seconds (user + system of all its threads and waited-for children,
`quickstart_runs.cpu_seconds`) and the step's mean reward, counting from the moment training is asked for:
the kit's clock starts when `train()` is called (starting the embedded Loops, loading the model), TRL's
before the model is loaded. Imports are outside both clocks (what a kit run imports only when it starts,
the embedded Loops' trainer, sampler and server and the Loops SDK, is imported first:
`import_embedded_loops`). Each side stops at the first step whose mean reward reaches 0.7 (the kit's
process exits there; TRL's callback stops training), or at its step cap: 8 on both sides, the quickstart's
`max_steps`. A seed that never reaches 0.7 counts as infinite, as in learning_speed. The kit runs the
quickstart as shipped, its `[compute.local] memory_budget_mb` included (TRL has no such setting).

TRL gets what the quickstart ships: SmolLM2-135M-Instruct in float32, a peft LoRA of rank 16 with the
kit's alpha (32), dropout 0 and the kit's target modules (`discover_target_modules`), the pattern's prompt
and answer (imported from its `episode.HiddenGame`), 4 prompts x 16 generations a step (per-device batch
16, 4 accumulation steps, so one generation of 64 and one optimizer step), 16 completion tokens,
temperature 1.0 (no top-p/top-k), learning rate 2e-3 and the kit's AdamW (betas 0.9/0.95, eps 1e-8, no
weight decay, gradient clipping at 1.0, constant schedule, no warm-up).

Deliberate simplifications:
- The reward is the episode's rule, restated: 1.0 if the answer is a substring of the lower-cased reply.
  `HiddenGame.run` reaches the model through the kit's `llm()` client, which TRL has no way to supply; the
  prompt and the answer still come from the episode's own `tasks()`.
- TRL's loss is made as close to the kit's as its options allow, not identical: advantages are centred
  without dividing by the group's std (`scale_rewards="none"`, as `loops_nb/rl/grpo.py`), the loss is
  normalised by the step's completion tokens (`loss_type="dapo"`, as the kit's importance-sampling loss
  divides by tokens), no KL term (`beta=0`), one update per generation (so PPO clipping never binds,
  as the kit's on-policy sync step). TRL still includes groups whose rewards are all equal (their
  advantages are zero) in the token count; the kit drops them.
- TRL runs with `gradient_checkpointing=False` and `bf16=False` (its GRPOConfig defaults are True): the
  kit computes in float32 without checkpointing, and checkpointing would charge TRL a second forward.
- One process per side per seed, on the same machine, one after the other: the machine's load at the
  moment each side runs is not controlled (see docs/benchmarks.md for the load when it was recorded).
- Both sides compute on one thread (`OMP_NUM_THREADS=1`; `LOOPS_NB_TRL_THREADS` changes it). On a loaded
  machine with two cores, two OpenMP threads spin-wait for each other while the other is descheduled, and
  the CPU seconds then measure the wait, not the work (the kit's seed 0 used 588 CPU s in 12 minutes with
  only one step done at load 6-7); one thread is the comparable figure, as in shared_prefix's record.
- TRL's step cap is `LOOPS_NB_TRL_MAX_STEPS` (default 8, the quickstart's `max_steps`).
- Both runs end at the step that reaches 0.7: what a run costs after it has learned the task (the kit's
  remaining quickstart steps, its saving and shutdown) is not measured.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import Result
from benchmarks.quickstart_runs import QUICKSTART, StepClock, cpu_seconds, import_embedded_loops

if TYPE_CHECKING:
    from loops_nb.run_events import StepRecord

SEEDS = (0, 1, 2)
TARGET = 0.7
MAX_STEPS = int(os.environ.get("LOOPS_NB_TRL_MAX_STEPS", "8"))
ROOT = Path(__file__).resolve().parents[1]
THREADS = os.environ.get("LOOPS_NB_TRL_THREADS", "1")
"""torch's intra-op threads on both sides (OMP_NUM_THREADS of each run's process)."""


def quickstart_settings() -> dict[str, Any]:
    """The quickstart's model, LoRA rank, sampling, batch and learning rate, read from train_local.toml."""
    import tomllib

    toml = tomllib.loads(QUICKSTART.read_text())
    return {
        "model": toml["model"]["base_model"],
        "lora_rank": toml["model"]["lora_rank"],
        "temperature": toml["sampling"]["temperature"],
        "max_tokens": toml["sampling"]["max_tokens"],
        "group_size": toml["training"]["group_size"],
        "groups_per_step": toml["training"]["groups_per_step"],
        "learning_rate": toml["training"]["learning_rate"],
        "answer": toml["runtime"]["options"]["answer"],
    }


def trl_run(seed: int, max_steps: int) -> dict[str, Any]:
    """TRL's GRPOTrainer on the quickstart's task in this process; each step's (wall s, CPU s, mean reward)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from loops_nb.local.lora_adapter import LORA_ALPHA, discover_target_modules
    from loops_nb.local.model_store import resolve_model

    sys.path.insert(0, str(QUICKSTART.parent))
    from episode import HiddenGame  # the pattern's own task: its prompt and its answer

    s = quickstart_settings()
    task = HiddenGame(answer=s["answer"]).tasks()[0]
    steps: list[tuple[float, float, float | None]] = []

    class Clock(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            if logs and "reward" in logs:
                reward = logs["reward"]
                steps.append((time.perf_counter() - started, cpu_seconds() - cpu_started, reward))
                if reward is not None and reward >= TARGET:
                    control.should_training_stop = True

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        """HiddenGame.run's rule: 1.0 if the answer is in the lower-cased reply."""
        return [
            1.0 if a in c[0]["content"].lower() else 0.0 for c, a in zip(completions, answer, strict=True)
        ]

    prompts_per_step = s["groups_per_step"]
    row = {"prompt": [{"role": "user", "content": task.data["prompt"]}], "answer": task.data["answer"]}
    dataset = Dataset.from_list([row] * (prompts_per_step * max_steps))
    path = resolve_model(s["model"]).path

    started, cpu_started = time.perf_counter(), cpu_seconds()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lora = LoraConfig(
        r=s["lora_rank"],
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=discover_target_modules(model),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            seed=seed,
            max_steps=max_steps,
            learning_rate=s["learning_rate"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_epsilon=1e-8,
            weight_decay=0.0,
            max_grad_norm=1.0,
            num_generations=s["group_size"],
            per_device_train_batch_size=s["group_size"],
            gradient_accumulation_steps=prompts_per_step,
            max_completion_length=s["max_tokens"],
            temperature=s["temperature"],
            top_p=1.0,
            top_k=0,
            beta=0.0,
            num_iterations=1,
            scale_rewards="none",
            loss_type="dapo",
            bf16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[Clock()],
        )
        trainer.train()
    return {"steps": steps}


def kit_run(seed: int) -> None:
    """The quickstart (its own 8-step cap) in this process, ended at the first step whose mean reward reaches
    TARGET: the clock's JSON is printed and the process exits there, as TRL's run stops there."""
    import asyncio
    import shutil

    from loops_nb import load

    import_embedded_loops()
    tmp = tempfile.mkdtemp()

    class StopAtTarget(StepClock):
        def on_step(self, record: StepRecord) -> None:
            super().on_step(record)
            reward = record.number("reward/mean")
            if reward is not None and reward >= TARGET:
                self.report()

        def report(self) -> None:
            print(json.dumps({"steps": [(t, c, r) for (t, r), c in zip(self.steps, self.cpu, strict=True)]}))
            sys.stdout.flush()
            shutil.rmtree(tmp, ignore_errors=True)
            os._exit(0)

    overrides = {"output.output_dir": tmp, "training.save_every": 0, "eval.enabled": False}
    project = load(QUICKSTART, overrides={**overrides, "training.seed": seed})
    clock = StopAtTarget()
    asyncio.run(project.train(observers=[clock]))
    clock.report()


def run_isolated(side: str, seed: int) -> list[tuple[float, float, float | None]]:
    """One side's run (`kit` or `trl`) for `seed` in a fresh Python process: each step's (wall s, CPU s, reward)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.trl_grpo", f"--{side}", str(seed), str(MAX_STEPS)],
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "OMP_NUM_THREADS": THREADS,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{side} run (seed {seed}) failed:\n{done.stderr[-3000:]}")
    return [tuple(s) for s in json.loads(done.stdout.strip().splitlines()[-1])["steps"]]  # type: ignore[misc]


def _first(steps: list[tuple[float, float, float | None]], index: int) -> float:
    return next((s[index] for s in steps if s[2] is not None and s[2] >= TARGET), math.inf)


def _seeds(values: list[float]) -> str:
    return ", ".join("never" if math.isinf(v) else f"{v:.0f}" for v in values)


def run() -> list[Result]:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print("  trl_grpo skipped: TRL is not installed (uv run --all-extras --group bench ...)", flush=True)
        return []
    kit_cpu, kit_wall, trl_cpu, trl_wall = [], [], [], []
    for seed in SEEDS:
        kit = run_isolated("kit", seed)
        trl = run_isolated("trl", seed)
        kit_cpu.append(_first(kit, 1))
        kit_wall.append(_first(kit, 0))
        trl_cpu.append(_first(trl, 1))
        trl_wall.append(_first(trl, 0))
        for name, steps in (("kit", kit), ("TRL", trl)):
            cpu_per_step = [b[1] - a[1] for a, b in itertools.pairwise(steps)]
            print(
                f"  seed {seed} {name}: reward >= {TARGET} at "
                f"{_first(steps, 1):.0f} CPU s / {_first(steps, 0):.0f} wall s; "
                f"rewards {[round(r or 0, 3) for _, _, r in steps]}; CPU s at each step "
                f"{[round(c) for _, c, _ in steps]}; CPU s per step after the first "
                f"{statistics.mean(cpu_per_step) if cpu_per_step else float('nan'):.1f}",
                flush=True,
            )
    aim = f">= 3.33 (kit <= 0.3x TRL's CPU s, issue 35); kit by seed {_seeds(kit_cpu)}, TRL {_seeds(trl_cpu)}"
    return [
        Result(
            f"CPU s to reward/mean >= {TARGET}, kit vs TRL GRPOTrainer, median of seeds {list(SEEDS)}",
            statistics.median(kit_cpu),
            statistics.median(trl_cpu),
            "CPU s",
            aim,
            higher_is_better=False,
        ),
        Result(
            f"wall s to reward/mean >= {TARGET}, kit vs TRL GRPOTrainer, median of seeds {list(SEEDS)}",
            statistics.median(kit_wall),
            statistics.median(trl_wall),
            "s",
            f"informational; kit by seed {_seeds(kit_wall)}, TRL {_seeds(trl_wall)}",
            higher_is_better=False,
        ),
    ]


if __name__ == "__main__" and sys.argv[1:2] == ["--trl"]:
    print(json.dumps(trl_run(int(sys.argv[2]), int(sys.argv[3]))))
elif __name__ == "__main__" and sys.argv[1:2] == ["--kit"]:
    kit_run(int(sys.argv[2]))
