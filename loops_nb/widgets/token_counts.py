"""Token counts: what a run sampled and trained per step (RL), or what a dataset trains (an SFT check report).

Tokens are what a run pays for and what it learns from, and their ratio is a health signal of its own: in RL,
sampled tokens that do not train (zero-variance groups, discarded attempts) are wasted rollouts; in SFT, a
dataset whose trained share is tiny spends most of each batch on context.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from loops_nb.run_events import StepRecord
from loops_nb.widgets.environment import Widget
from loops_nb.widgets.style import GREY, MONOSPACE, div, plural, tag

if TYPE_CHECKING:
    from loops_nb.sft.report import CheckReport

PREFIX = "tokens/"
_TABLE = f"border-collapse:collapse;font:12px/1.4 {MONOSPACE}"
_CELL = "padding:1px 10px;text-align:right;border-bottom:1px solid #e5e7eb"
_HEAD = "padding:1px 10px;text-align:right;border-bottom:1px solid #9ca3af;color:#374151;font-weight:600"
# The denominator of the trained share: RL samples tokens, SFT batches contain them.
_SHARE_OF = ("tokens/sampled", "tokens/total")


class TokenCounts(Widget):
    """Per-step ``tokens/*`` counts from step records, with totals; or a dataset summary (`from_report`).

    Every ``tokens/<name>`` key of a record becomes a column; totals add the per-step values up.
    """

    def __init__(self, *, recent: int = 8) -> None:
        self.recent = recent
        self.steps: list[tuple[int, dict[str, int]]] = []
        self.totals: dict[str, int] = {}  # by key, in the order the keys first came: the columns
        self.report_rows: list[tuple[str, str]] | None = None  # set by from_report
        self._report_summary = ""

    # -- input -------------------------------------------------------------------------------------------------

    def on_step(self, step: StepRecord) -> None:
        """Take a step record's ``tokens/*`` counts (records without any are ignored)."""
        counts = {
            k: int(v) for k in step.metrics if k.startswith(PREFIX) and (v := step.number(k)) is not None
        }
        if not counts:
            return
        self.steps.append((step.step + 1, counts))  # numbered from 1, as the rest of the panel
        for key, value in counts.items():
            self.totals[key] = self.totals.get(key, 0) + value

    @classmethod
    def from_report(cls, report: CheckReport) -> TokenCounts:
        """The trained/untrained totals of an SFT `CheckReport`."""
        counts = cls()
        counts.totals = {
            "tokens/total": report.tokens,
            "tokens/trained": report.trained_tokens,
            "tokens/untrained": report.untrained_tokens,
        }
        share = _share(report.trained_tokens, report.tokens)
        split = f"{report.rows_trained:,} / {report.rows_split:,} / {report.rows_refused:,}"
        rows = [
            ("tokens", f"{report.tokens:,}"),
            ("trained", f"{report.trained_tokens:,}{share}"),
            ("untrained (context, masked)", f"{report.untrained_tokens:,}"),
            ("examples", f"{report.n_examples:,}"),
            ("rows: train / split / refused", split),
        ]
        if report.n_examples:
            mean = report.tokens / report.n_examples
            rows.append(("example length: mean / max", f"{mean:,.0f} / {report.max_length:,}"))
        if report.total_steps is not None:
            rows.append(("steps (estimate)", f"~{report.total_steps:,}"))
        counts.report_rows = rows
        counts._report_summary = (
            f"dataset: {report.tokens:,} tokens, {report.trained_tokens:,} "
            f"trained{share}, {report.untrained_tokens:,} untrained, "
            f"{report.n_examples:,} examples"
        )
        return counts

    # -- views -------------------------------------------------------------------------------------------------

    @property
    def trained_share(self) -> float | None:
        trained = self.totals.get("tokens/trained")
        of = next((self.totals[k] for k in _SHARE_OF if k in self.totals), None)
        return trained / of if trained is not None and of else None

    def summary(self) -> str:
        if self.report_rows is not None:
            return self._report_summary
        if not self.steps:
            return "tokens: no steps yet"
        parts = [f"{_label(k)} {self.totals[k]:,}" for k in self.totals]
        share = f" ({self.trained_share:.1%} trained)" if self.trained_share is not None else ""
        return f"tokens over {plural(len(self.steps), 'step')}: {', '.join(parts)}{share}"

    def __str__(self) -> str:
        if self.report_rows is not None:
            width = max(len(k) for k, _ in self.report_rows)
            return "\n".join([self.summary(), *(f"  {k:<{width}}  {v}" for k, v in self.report_rows)])
        if not self.steps:
            return self.summary()
        grid = self._grid()
        widths = [max(len(row[i]) for row in grid) for i in range(len(grid[0]))]
        lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in grid]
        return "\n".join([self.summary(), *lines])

    def to_html(self) -> str:
        if self.report_rows is not None:
            key = f"{_CELL};text-align:left;color:#374151"
            rows = [
                tag("tr", tag("td", escape(k), key) + tag("td", escape(v), _CELL))
                for k, v in self.report_rows
            ]
        elif not self.steps:
            return div(escape(self.summary()), f"font:12px monospace;color:{GREY}")
        else:
            header, *grid = self._grid()
            rows = [tag("tr", "".join(tag("th", escape(h), _HEAD) for h in header))]
            if (skipped := len(self.steps) - self.recent) > 0:
                rows.append(
                    f'<tr><td colspan="{len(self.totals) + 1}" style="{_CELL};color:#9ca3af">'
                    f"… {plural(skipped, 'earlier step')}</td></tr>"
                )
            for n, row in enumerate(grid, 1):
                bold = ";font-weight:600" if n == len(grid) else ""  # the totals
                rows.append(tag("tr", "".join(tag("td", cell, f"{_CELL}{bold}") for cell in row)))
        return div(tag("table", "".join(rows), _TABLE) + self._share_bar())

    def _grid(self) -> list[list[str]]:
        """The header, the recent steps and the totals, as the text and the HTML table show them."""
        header = ["step", *(_label(k) for k in self.totals)]
        body = [[str(s), *(f"{c.get(k, 0):,}" for k in self.totals)] for s, c in self.steps[-self.recent :]]
        return [header, *body, ["total", *(f"{v:,}" for v in self.totals.values())]]

    def _share_bar(self) -> str:
        share = self.trained_share
        if share is None:
            return ""
        pct = max(0.0, min(share, 1.0)) * 100
        bar = div("", f"width:{pct:.1f}%;height:8px;background:rgba(46,160,67,0.75)")
        track = "margin-top:4px;width:240px;height:8px;background:#e5e7eb;border-radius:4px;overflow:hidden"
        label = div(f"{share:.1%} of tokens trained", f"font:11px monospace;color:{GREY}")
        return tag("div", bar, track, f"trained share of tokens: {share:.1%}") + label


def _label(key: str) -> str:
    return key.removeprefix(PREFIX)


def _share(part: int, whole: int) -> str:
    return f" ({part / whole:.1%})" if whole else ""
