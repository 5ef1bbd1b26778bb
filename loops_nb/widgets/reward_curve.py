"""Training curves: `RewardCurve` (RL: mean reward per step with its spread) and `LossCurve` (SFT: train and eval
loss).

Each curve is one object with three renderers: a one-line ``text/plain`` summary, inline-SVG ``text/html`` and a
plotly figure. Live JupyterLab and a reopened notebook show the plotly chart (full data, zoom, hover);
``nbconvert --to html`` and frontends without plotly show the SVG; logs and scripts the text. Feed a curve step
records (``curve.on_step(record)``; it is a partial run observer) or values (``curve.add(...)``), and show it live
with ``curve.show()``, which returns a throttled `LiveDisplay`.
"""

from __future__ import annotations

from html import escape
from typing import Any, Literal, Unpack

from loops_nb.run_events import EvalRecord
from loops_nb.step_record import StepRecord
from loops_nb.widgets.environment import DisplayOptions, LiveDisplay
from loops_nb.widgets.plotly_chart import plotly_bundle, plotly_figure
from loops_nb.widgets.svg_chart import (
    Series,
    dot_chart,
    fmt,
    sparkline,
    svg_chart,
)

REWARD_COLOR = "#2563eb"
LOSS_COLOR = "#dc2626"
EVAL_COLOR = "#7c3aed"


class _Curve:
    """What both curves share: the renderers, built from `series()`."""

    title = ""
    y_label = ""

    def series(self) -> list[Series]:
        raise NotImplementedError

    def summary(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.summary()}>"

    def to_svg(self, *, width: int = 520, height: int = 220) -> str:
        return svg_chart(self.series(), title=self.title, y_label=self.y_label, width=width, height=height)

    def to_dot_chart(self, *, width: int = 520, height: int = 160) -> str:
        """The sanitizer-proof variant (positioned divs), for composite panels."""
        return dot_chart(self.series(), title=self.title, width=width, height=height)

    def to_html(self) -> str:
        return (
            f'<div style="display:inline-block">{self.to_svg()}'
            f'<div style="font:12px monospace;color:#374151;margin-top:2px">{escape(self.summary())}</div></div>'
        )

    def to_plotly(self) -> dict[str, Any]:
        return plotly_figure(self.series(), title=self.title, y_label=self.y_label)

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.summary(), "text/html": self.to_html()}
        if self._has_points():
            bundle.update(plotly_bundle(self.to_plotly()))
        return bundle

    def _has_points(self) -> bool:
        return any(s.points() for s in self.series())

    def show(self, **options: Unpack[DisplayOptions]) -> LiveDisplay:
        """Display the curve and return its `LiveDisplay`: call ``.update()`` after adding points, and
        ``.finalize()`` at the end."""
        return LiveDisplay(self, **options).show()


class RewardCurve(_Curve):
    """Mean reward per step with its spread: a ±std band (``spread="std"``), or the min..max range
    (``spread="minmax"``, from ``reward/min`` and ``reward/max``), or none."""

    def __init__(
        self,
        *,
        spread: Literal["std", "minmax", "none"] = "std",
        key: str = "reward/mean",
        title: str = "reward",
        color: str = REWARD_COLOR,
    ) -> None:
        self.spread = spread
        self.key = key
        self.title = title
        self.y_label = key
        self.color = color
        self.steps: list[int] = []
        self.means: list[float | None] = []
        self.lows: list[float | None] = []
        self.highs: list[float | None] = []
        self.stds: list[float | None] = []
        self.eval_steps: list[int] = []
        """Steps applied to each evaluated policy (0: the base model), from `[eval]`."""
        self.eval_means: list[float | None] = []

    def add(
        self,
        step: int,
        mean: float | None,
        *,
        std: float | None = None,
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        """One step's mean; ``std`` or ``low``/``high`` give the band. A repeated step replaces the old value (a
        resumed run re-logs the steps after its checkpoint)."""
        if self.spread == "std" and std is not None and mean is not None:
            low, high = mean - std, mean + std
        elif self.spread == "none":
            low = high = None
        if self.steps and step <= self.steps[-1]:
            cut = next(i for i, s in enumerate(self.steps) if s >= step)
            for values in (self.steps, self.means, self.lows, self.highs, self.stds):
                del values[cut:]
        self.steps.append(step)
        self.means.append(mean)
        self.stds.append(std)
        self.lows.append(low)
        self.highs.append(high)

    def on_step(self, step: StepRecord) -> None:
        """Take a step record (``step``, ``reward/mean``, ``reward/std``, ``reward/min``, ``reward/max``)."""
        if self.key not in step.metrics:
            return
        self.add(
            step.step + 1,  # the panel numbers steps from 1 (the record's step counts from 0)
            step.number(self.key),
            std=step.number("reward/std"),
            low=step.number("reward/min"),
            high=step.number("reward/max"),
        )

        if "eval/reward_mean" in step.metrics:  # the eval of the policy this step's rollouts sampled
            self.add_eval(step.step, step.number("eval/reward_mean"))

    add_record = on_step

    def add_eval(self, step: int, mean: float | None) -> None:
        """The eval reward of the policy after ``step`` steps; a repeated step replaces the old value."""
        points = dict(zip(self.eval_steps, self.eval_means, strict=True))
        points[step] = mean
        self.eval_steps, self.eval_means = sorted(points), [points[s] for s in sorted(points)]

    def on_eval(self, line: EvalRecord) -> None:
        """Take an RL evaluation's evals.jsonl line (``step``, ``eval/reward_mean``): the `on_eval` event."""
        self.add_eval(line.step, line.number("eval/reward_mean"))

    @property
    def last(self) -> float | None:
        return next((m for m in reversed(self.means) if m is not None), None)

    @property
    def last_eval(self) -> tuple[int, float] | None:
        """(steps applied, eval reward) of the latest evaluation with a value."""
        return next(
            (
                (s, v)
                for s, v in zip(reversed(self.eval_steps), reversed(self.eval_means), strict=True)
                if v is not None
            ),
            None,
        )

    @property
    def best(self) -> float | None:
        values = [m for m in self.means if m is not None]
        return max(values) if values else None

    def summary(self) -> str:
        return f"{self.title}: {_steps(len(self.steps))}, last {fmt(self.last, 3)}, best {fmt(self.best, 3)}"

    def __str__(self) -> str:
        return f"{self.summary()} {sparkline(self.means)}".rstrip()

    def series(self) -> list[Series]:
        band = (self.lows, self.highs) if any(v is not None for v in self.lows) else None
        out = [Series(self.key, self.steps, self.means, self.color, band=band, hover=self._hover())]
        if any(v is not None for v in self.eval_means):
            out.append(
                Series(
                    "eval reward",
                    self.eval_steps,
                    self.eval_means,
                    EVAL_COLOR,
                    dash=True,
                    connect_gaps=True,
                    hover=[
                        f"eval after {s} steps: reward {fmt(v)}"
                        for s, v in zip(self.eval_steps, self.eval_means, strict=True)
                    ],
                )
            )
        return out

    def _hover(self) -> list[str]:
        out = []
        for step, mean, std, lo, hi in zip(
            self.steps, self.means, self.stds, self.lows, self.highs, strict=True
        ):
            text = f"step {step}: {self.key} {fmt(mean)}"
            if self.spread == "std" and std is not None:
                text += f" ± {fmt(std, 3)}"
            elif lo is not None and hi is not None:
                text += f" [{fmt(lo, 3)}, {fmt(hi, 3)}]"
            out.append(text)
        return out


class LossCurve(_Curve):
    """SFT train loss per step, and eval loss on the steps that have one (dashed)."""

    def __init__(self, *, title: str = "loss") -> None:
        self.title = title
        self.y_label = "loss"
        self.steps: list[int] = []
        self.losses: list[float | None] = []
        self.eval_losses: list[float | None] = []

    def add(self, step: int, loss: float | None = None, eval_loss: float | None = None) -> None:
        """Step ``step``'s train loss, and the eval loss after it; a repeated step cuts the later ones."""
        if self.steps and step <= self.steps[-1]:
            cut = next(i for i, s in enumerate(self.steps) if s >= step)
            for values in (self.steps, self.losses, self.eval_losses):
                del values[cut:]
        self.steps.append(step)
        self.losses.append(loss)
        self.eval_losses.append(eval_loss)

    def add_eval(self, step: int, eval_loss: float | None) -> None:
        """The eval loss after ``step`` steps (0: before training), at that step's point or a new one."""
        if step in self.steps:
            self.eval_losses[self.steps.index(step)] = eval_loss
            return
        at = next((i for i, s in enumerate(self.steps) if s > step), len(self.steps))
        self.steps.insert(at, step)
        self.losses.insert(at, None)
        self.eval_losses.insert(at, eval_loss)

    def on_eval(self, line: EvalRecord) -> None:
        """Take an SFT evaluation's evals.jsonl line (``step`` = steps applied, ``eval/loss``)."""
        value = line.number("eval/loss")
        if value is not None:
            self.add_eval(line.step, value)

    @property
    def eval_before(self) -> float | None:
        """The held-out loss before training (the eval at step 0), if there was one."""
        return self.eval_losses[0] if self.steps and self.steps[0] == 0 else None

    def on_step(self, step: StepRecord) -> None:
        """Take a step record (``step``, ``loss``, ``eval/loss``)."""
        if "loss" in step.metrics or "eval/loss" in step.metrics:
            self.add(step.step + 1, step.number("loss"), step.number("eval/loss"))

    add_record = on_step

    @property
    def last(self) -> float | None:
        return next((v for v in reversed(self.losses) if v is not None), None)

    @property
    def last_eval(self) -> tuple[int, float] | None:
        return next(
            (
                (s, v)
                for s, v in zip(reversed(self.steps), reversed(self.eval_losses), strict=True)
                if v is not None
            ),
            None,
        )

    @property
    def best_eval(self) -> float | None:
        values = [v for v in self.eval_losses if v is not None]
        return min(values) if values else None

    def summary(self) -> str:
        trained = sum(1 for v in self.losses if v is not None)
        text = f"{self.title}: {_steps(trained)}, last {fmt(self.last, 3)}"
        if self.eval_before is not None:
            text += f", eval before training {fmt(self.eval_before, 3)}"
        if self.last_eval is not None:
            step, value = self.last_eval
            text += f", eval {fmt(value, 3)} at step {step}, best eval {fmt(self.best_eval, 3)}"
        return text

    def __str__(self) -> str:
        return f"{self.summary()} {sparkline(self.losses)}".rstrip()

    def series(self) -> list[Series]:
        out = [
            Series(
                "train loss",
                self.steps,
                self.losses,
                LOSS_COLOR,
                hover=[f"step {s}: loss {fmt(v)}" for s, v in zip(self.steps, self.losses, strict=True)],
            )
        ]
        if any(v is not None for v in self.eval_losses):
            out.append(
                Series(
                    "eval loss",
                    self.steps,
                    self.eval_losses,
                    EVAL_COLOR,
                    dash=True,
                    connect_gaps=True,
                    hover=[
                        f"eval after {s} steps: loss {fmt(v)}"
                        if s
                        else f"eval before training: loss {fmt(v)}"
                        for s, v in zip(self.steps, self.eval_losses, strict=True)
                    ],
                )
            )
        return out


def _steps(n: int) -> str:
    return "1 step" if n == 1 else f"{n} steps"
