"""Which examples train at which step: the held-out split, the per-epoch order and token batches.

Everything here is a pure function of the data files and the config, so the mapping *step -> batch* is the
same in every process that computes it: a resumed run recomputes the plan and trains the rest, with no batch
replayed or skipped. One streaming pass keeps a few integers per example, never its tokens
(docs/reference/sft.md#the-plan-which-examples-train-at-which-step).
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loops_nb.errors import DataError
from loops_nb.sft.data import RefusedRow, jsonl_lines, parse_line
from loops_nb.sft.report import CheckReport
from loops_nb.sft.targets import Example, RenderedRow, SFTTargets, sft_targets

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loops_nb.llm.renderer_choice import RendererChoice
    from loops_nb.sft.config import SFTConfig

_HASH_SCALE = float(2**64)


def is_held_out(row_number: int, seed: int, fraction: float) -> bool:
    """Whether row ``row_number`` of the training file is held out (``fraction`` of rows, chosen by hash)."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(f"sft-split:{seed}:{row_number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _HASH_SCALE < fraction


def require_data_file(path: Path, what: str, config_path: Path | None = None) -> None:
    """`DataError` when a data file is missing, naming the script beside it (or the config) that would make it."""
    if path.is_file():
        return
    message = f"{what}: {path} does not exist"
    places = [path.parent] + ([config_path.parent] if config_path is not None else [])
    for folder in dict.fromkeys(places):
        for name in ("prepare.py", "make_data.py"):
            script = folder / name
            if script.is_file():
                raise DataError(f"{message}; run `python {script}` first, it writes the data")
    raise DataError(message)


class ExampleIndex:
    """Where each example of a file is, and its size: enough to plan batches and rebuild any of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets = array("q")
        self.rows = array("q")
        self.subs = array("l")
        self.tokens = array("q")
        self.trained = array("q")

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, offset: int, rendered: RenderedRow) -> None:
        # Every example trains: the renderer refuses a row whose example has no trainable target, so what
        # `check` counts (the same RenderedRow) is exactly what is indexed here.
        for sub, example in enumerate(rendered.examples):
            self.offsets.append(offset)
            self.rows.append(rendered.row_number)
            self.subs.append(sub)
            self.tokens.append(example.n_tokens)
            self.trained.append(example.n_trained)

    def load(self, indices: Sequence[int], renderer: SFTTargets) -> list[Example]:
        """The examples at ``indices`` (in that order), rendered again from their rows."""
        by_offset: dict[int, list[Example]] = {}
        out = []
        with self.path.open("rb") as f:
            for i in indices:
                offset = self.offsets[i]
                examples = by_offset.get(offset)
                if examples is None:
                    f.seek(offset)
                    result = renderer.render(parse_line(f.readline(), self.rows[i], self.path.parent))
                    if not isinstance(result, RenderedRow):
                        raise DataError(
                            f"{self.path}: row {self.rows[i]} no longer renders as it did when the run was "
                            f"planned ({result.reason}); was the file changed during the run?"
                        )
                    examples = by_offset[offset] = result.examples
                example = examples[self.subs[i]]
                if example.n_tokens != self.tokens[i]:
                    raise DataError(
                        f"{self.path}: row {self.rows[i]} changed since the run was planned (its example "
                        f"{self.subs[i]} is {example.n_tokens} tokens, was {self.tokens[i]})"
                    )
                out.append(example)
        return out


def pack(order: Sequence[int], sizes: Sequence[int], budget: int) -> list[int]:
    """Batch boundaries over ``order``: batch k is ``order[bounds[k]:bounds[k+1]]``.

    A batch takes the next examples while their tokens fit ``budget``; an example larger than the budget is a
    batch alone. The result starts with 0 and ends with ``len(order)``.
    """
    bounds = [0]
    fill = 0
    for position, i in enumerate(order):
        n = sizes[i]
        if fill and fill + n > budget:
            bounds.append(position)
            fill = 0
        fill += n
    if order:
        bounds.append(len(order))
    return bounds


@dataclass(frozen=True)
class Batch:
    step: int
    """0-based optimizer step that trains it."""
    epoch: int
    """0-based pass over the training data."""
    indices: tuple[int, ...]
    """Positions in the training `ExampleIndex`."""


class BatchPlan:
    """Every step's batch for a training index, epochs and token budget: a pure function of those."""

    def __init__(
        self, index: ExampleIndex, *, batch_tokens: int, epochs: int, seed: int, max_steps: int | None = None
    ) -> None:
        self.index = index
        self._orders: list[array] = []
        self._bounds: list[list[int]] = []
        for epoch in range(epochs):
            # A permutation seeded by (seed, epoch): a string seed hashes the same in every process.
            order = list(range(len(index)))
            random.Random(f"sft-order:{seed}:{epoch}").shuffle(order)
            self._orders.append(array("q", order))
            self._bounds.append(pack(order, index.tokens, batch_tokens))
        self.steps_per_epoch = [len(b) - 1 for b in self._bounds]
        planned = sum(self.steps_per_epoch)
        self.total_steps = planned if max_steps is None else min(max_steps, planned)

    def batch(self, step: int) -> Batch:
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} is outside the plan (0..{self.total_steps - 1})")
        epoch, k = 0, step
        while k >= self.steps_per_epoch[epoch]:
            k -= self.steps_per_epoch[epoch]
            epoch += 1
        bounds = self._bounds[epoch]
        return Batch(step, epoch, tuple(self._orders[epoch][bounds[k] : bounds[k + 1]]))

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """The batches of steps ``start`` .. ``total_steps - 1``."""
        for step in range(start, self.total_steps):
            yield self.batch(step)

    def batch_id(self, step: int) -> str:
        """A short hash of the step's example ids (``row:sub``: the file's line number and the example's index
        within the row), in order: equal ids, equal batch."""
        rows, subs = self.index.rows, self.index.subs
        text = ",".join(f"{rows[i]}:{subs[i]}" for i in self.batch(step).indices)
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    @property
    def epochs_covered(self) -> float:
        """How many passes over the data the planned steps make (fractional when max_steps cuts an epoch)."""
        done, left = 0.0, self.total_steps
        for n in self.steps_per_epoch:
            if left >= n:
                done, left = done + 1, left - n
            else:
                return done + (left / n if n else 0.0)
        return done


@dataclass
class HeldOut:
    """The held-out set: where it comes from, its rows' report, and the examples evaluated."""

    source: str
    """How it was chosen, for reports: the eval file, or the share of training rows."""
    index: ExampleIndex | None = None
    report: CheckReport = field(default_factory=CheckReport)
    """Its rows, counted and refused as `check` counts training rows; ``report.source`` is the file they are
    read from (the eval file, or the training file)."""
    truncated: bool = False
    """True when the eval file was read only until ``eval_max_examples`` examples were found."""

    @property
    def examples(self) -> int:
        return 0 if self.index is None else len(self.index)


@dataclass
class SFTData:
    """A run's data: its targets (the renderer), the training index and its batch plan, the held-out
    examples, the report."""

    targets: SFTTargets
    train: ExampleIndex
    plan: BatchPlan
    held_out: HeldOut
    report: CheckReport
    eval_cap: int

    @classmethod
    def load(
        cls,
        config: SFTConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        config_path: Path | None = None,
        on_refusal: Callable[[Path, RefusedRow], None] | None = None,
        renderer_choice: RendererChoice | None = None,
    ) -> SFTData:
        """Stream the data files once: render every row, split, index, report and plan.

        ``on_refusal(path, refused)`` is called for every refused row of either file, as it is read.
        ``renderer_choice``: the renderer the run recorded, for a resume (default: what ``config.model`` resolves
        to).
        """
        d, t = config.data, config.training
        renderer = sft_targets(config.model, tokenizer, renderer_choice)
        require_data_file(d.train, "data.train", config_path)
        train = ExampleIndex(d.train)
        cap = t.eval_max_examples
        if d.eval is not None:
            require_data_file(d.eval, "data.eval", config_path)
            held = HeldOut(
                f"the eval file {d.eval.name}", ExampleIndex(d.eval), CheckReport(source=str(d.eval))
            )
        elif d.eval_fraction > 0:
            held = HeldOut(
                f"{d.eval_fraction:.0%} of the training rows, chosen by a hash of the row number and "
                f"data.shuffle_seed ({d.shuffle_seed})",
                ExampleIndex(d.train),
                CheckReport(source=str(d.train)),
            )
        else:
            held = HeldOut("none (data.eval_fraction = 0 and no data.eval)")

        def route(row_number: int) -> ExampleIndex | None:
            if d.eval is None and is_held_out(row_number, d.shuffle_seed, d.eval_fraction):
                return held.index if len(held.index or ()) < cap else None
            return train

        def read(
            path: Path,
            route: Callable[[int], ExampleIndex | None],
            *,
            max_rows: int | None = None,
            stop: Callable[[], bool] | None = None,
        ) -> None:
            """Render each row of ``path``, index what trains where ``route(row_number)`` says, and count it."""
            for n, (row_number, start, line) in enumerate(jsonl_lines(path)):
                if (max_rows is not None and n >= max_rows) or (stop is not None and stop()):
                    return
                index = route(row_number)
                result = renderer.render(parse_line(line, row_number, path.parent))
                if index is not None and isinstance(result, RenderedRow):
                    index.add(start, result)
                elif on_refusal is not None and isinstance(result, RefusedRow):
                    on_refusal(path, result)
                # A held-out row (maybe past the cap) is counted in the held-out report, never trained.
                (report if index is train else held.report).add(result)

        report = CheckReport(epochs=t.epochs, source=str(d.train))
        read(d.train, route, max_rows=d.max_rows)
        if d.eval is not None:
            assert held.index is not None
            eval_index = held.index
            read(d.eval, lambda _: eval_index, stop=lambda: len(eval_index) >= cap)
            held.truncated = len(eval_index) >= cap
        plan = BatchPlan(
            train, batch_tokens=t.batch_tokens, epochs=t.epochs, seed=d.shuffle_seed, max_steps=t.max_steps
        )
        return cls(renderer, train, plan, held, report, cap)

    def eval_examples(self) -> list[Example]:
        """The first ``eval_max_examples`` held-out examples, in file order."""
        index = self.held_out.index
        if index is None or not len(index):
            return []
        return index.load(range(min(len(index), self.eval_cap)), self.targets)
