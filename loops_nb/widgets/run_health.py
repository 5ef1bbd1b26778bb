"""Run health: the handful of numbers to read, in the order to read them, each with a hint.

RL's reading order: docs/reference/training_loop.md, "Reading a run's health". SFT step records (``loss``,
``eval/loss``) get the two questions that matter there: is loss falling, and is eval loss following it. The
hints are rough guides over the last ``window`` steps, not verdicts: they point at what to look at next.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from html import escape
from typing import Literal

from loops_nb.run_events import AttemptFinished, StepRecord
from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import UI, fmt, plural, sparkline, tag

Status = Literal["ok", "warn", "bad", "info", "wait"]
_GLYPH: dict[str, tuple[str, str]] = {
    "ok": ("✓", "#1a7f37"),
    "warn": ("!", "#9a6700"),
    "bad": ("✗", "#cf222e"),
    "info": ("·", "#57606a"),
    "wait": ("…", "#8c959f"),
}
KL_WARN, KL_BAD = 0.01, 0.1
ZERO_VARIANCE_WARN, ZERO_VARIANCE_BAD = 0.5, 0.9
DISCARD_WARN, DISCARD_BAD = 0.1, 0.5
_PAD = "padding:1px 6px"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    value: str
    hint: str
    trend: str = ""


class RunHealth(Widget):
    """Health checks computed from step records (``on_step``); ``attempts_seen`` and ``attempts_anchor`` let the
    transcripts check point at an `AttemptsTable`."""

    def __init__(self, *, window: int = 10, attempts_anchor: str | None = None) -> None:
        self.window = window
        self.attempts_anchor = attempts_anchor
        self.records: list[dict[str, float]] = []
        self.discard_reasons: Counter[str] = Counter()
        self.attempts_seen = 0

    def on_step(self, record: StepRecord) -> None:
        # Only numbers are kept: a long run's records stay small.
        self.records.append({k: v for k, v in record.metrics.items() if isinstance(v, int | float)})
        for key, value in record.metrics.items():
            if key.startswith("discarded/") and isinstance(value, int):
                self.discard_reasons[key.removeprefix("discarded/")] += value

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self.attempts_seen += 1

    # -- checks ------------------------------------------------------------------------------------------------

    def checks(self) -> list[Check]:
        if any("reward/mean" in r for r in self.records):
            return [self._reward(), self._signal(), self._discards(), self._kl(), self._transcripts()]
        if any("loss" in r for r in self.records):
            return [self._loss(), self._eval_loss()]
        return [Check("steps", "wait", "0", "waiting for the first step")]

    def _series(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.records if key in r]

    def _trend(self, values: list[float]) -> tuple[list[float], float]:
        """The last ``window`` values, and how far the mean of their second half is from their first's."""
        recent = values[-self.window :]
        half = len(recent) // 2
        return recent, statistics.fmean(recent[half:]) - statistics.fmean(recent[:half]) if half else 0.0

    def _reward(self) -> Check:
        values = self._series("reward/mean")
        recent, delta = self._trend(values)
        status: Status
        if len(values) < 4:
            status, hint = "wait", "too few steps for a trend"
        else:
            stds = self._series("reward/std")[-self.window :]
            scale = (
                statistics.fmean(stds) if stds and statistics.fmean(stds) > 0 else max(abs(recent[-1]), 1e-3)
            )
            over = f"over the last {len(recent)} steps"
            if max(recent) - min(recent) < 1e-9:
                status, hint = "warn", f"flat: unchanged {over}"
            elif delta > 0.1 * scale:
                status, hint = "ok", f"rising ({delta:+.3g} {over})"
            elif delta < -0.1 * scale:
                status = "warn"
                hint = f"falling ({delta:+.3g} {over}): read transcripts; check KL and the learning rate"
            else:
                status = "warn" if len(values) >= 2 * self.window else "info"
                hint = f"flat ({delta:+.3g} {over}): is there signal? see group variance below"
        return Check("reward/mean", status, fmt(values[-1], 3), hint, sparkline(values))

    def _signal(self) -> Check:
        stds = self._series("reward/group_std_mean")
        zero = self._series("groups/zero_variance_frac")[-self.window :]
        status: Status
        if not zero:
            status, hint = "info", "zero-variance share not reported"
        else:
            share = statistics.fmean(zero)
            hint = f"{share:.0%} of groups had identical rewards (they train nothing)"
            if share >= ZERO_VARIANCE_BAD:
                status = "bad"
                hint += ": almost no learning signal; tasks too easy or too hard, or reward too coarse"
            elif share >= ZERO_VARIANCE_WARN:
                status = "warn"
                hint += ": weak signal; a larger group size or a finer-grained reward helps"
            else:
                status = "ok"
        value = fmt(stds[-1], 3) if stds else "-"
        return Check("reward/group_std_mean", status, value, hint, sparkline(stds))

    def _discards(self) -> Check:
        recent = self.records[-self.window :]
        attempts = sum(int(r.get("attempts", 0)) for r in recent)
        discarded = sum(int(r.get("attempts/discarded", 0)) for r in recent)
        if not attempts:
            return Check("discarded", "info", "-", "attempt counts not reported")
        share = discarded / attempts
        reasons = ", ".join(f"{k} ×{n}" for k, n in self.discard_reasons.most_common(3))
        text = f"{discarded} of {attempts} attempts in the last {len(recent)} steps" + (
            f"; all run: {reasons}" if reasons else ""
        )
        status: Status = "bad" if share >= DISCARD_BAD else "warn" if share >= DISCARD_WARN else "ok"
        return Check("discarded", status, f"{share:.0%}", text)

    def _kl(self) -> Check:
        values = self._series("kl/sample_train_v1")
        if not values:
            return Check("kl/sample_train_v1", "info", "-", "not reported yet (needs a trained step)")
        worst = max(abs(v) for v in values[-self.window :])
        status: Status
        if worst >= KL_BAD:
            status, hint = (
                "bad",
                "sampler and trainer disagree on the policy: stale sampler weights or a numerics mismatch",
            )
        elif worst >= KL_WARN:
            status, hint = "warn", "sampler and trainer drift apart; watch it"
        else:
            status, hint = "ok", "sampler and trainer agree"
        hint += f" (max |kl| {fmt(worst, 2)} in the last {min(len(values), self.window)} steps)"
        return Check("kl/sample_train_v1", status, fmt(values[-1], 3), hint, sparkline(values))

    def _transcripts(self) -> Check:
        hint = "attempts seen: read a few below; reward can rise for the wrong reason"
        return Check("transcripts", "info", str(self.attempts_seen), hint)

    def _loss(self) -> Check:
        values = self._series("loss")
        if len(values) < 4:
            return Check("loss", "wait", fmt(values[-1], 3) if values else "-", "too few steps for a trend")
        recent, delta = self._trend(values)
        status: Status = "ok" if delta < 0 else "warn"
        hint = (
            f"falling ({delta:+.3g})"
            if delta < 0
            else f"not falling ({delta:+.3g} over {len(recent)} steps): check the learning rate and the target preview"
        )
        return Check("loss", status, fmt(values[-1], 3), hint, sparkline(values))

    def _eval_loss(self) -> Check:
        values = self._series("eval/loss")
        if not values:
            return Check("eval/loss", "info", "-", "no eval yet")
        best = min(values)
        if len(values) >= 2 and values[-1] > best * 1.02:
            status: Status = "warn"
            hint = f"above its best ({fmt(best, 3)}): overfitting? compare with train loss"
        else:
            status, hint = "ok", "at its best so far"
        return Check("eval/loss", status, fmt(values[-1], 3), hint, sparkline(values))

    # -- renderers ---------------------------------------------------------------------------------------------

    def summary(self) -> str:
        counts = Counter(c.status for c in self.checks())
        parts = ", ".join(f"{counts[s]} {s}" for s in ("ok", "warn", "bad") if counts[s])
        return f"health over {plural(len(self.records), 'step')}{': ' + parts if parts else ''}"

    def __str__(self) -> str:
        lines = [self.summary()]
        for c in self.checks():
            lines.append(f"  {_GLYPH[c.status][0]} {c.name:<22} {c.value:>8}  {c.hint}")
        return "\n".join(lines)

    def to_html(self) -> str:
        rows = []
        for c in self.checks():
            glyph, colour = _GLYPH[c.status]
            hint = escape(c.hint)
            if c.name == "transcripts" and self.attempts_anchor:
                hint = f'<a href="#{escape(self.attempts_anchor)}" style="color:#0969da">{hint}</a>'
            cells = [tag("td", glyph, f"{_PAD};color:{colour};font-weight:700", c.status)]
            cells += [
                tag("td", escape(c.name), f"{_PAD};white-space:nowrap;text-align:left"),
                tag("td", escape(c.value), f"{_PAD};text-align:right;font-weight:600;white-space:nowrap"),
                tag("td", escape(c.trend), f"{_PAD};color:#57606a;letter-spacing:-1px;white-space:nowrap"),
                tag("td", hint, f"{_PAD};color:#1f2328;text-align:left"),
            ]
            rows.append(tag("tr", "".join(cells)))
        return tag("table", "".join(rows), f"border-collapse:collapse;font:12px/1.5 {UI}")
