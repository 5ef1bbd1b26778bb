"""TokenCounts, AttemptsTable and RunHealth: renderers and hints."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from widget_fixtures import assert_static_html, rl_attempt, rl_step

from loops_nb.errors import UserError
from loops_nb.run_events import StepRecord, StepRollouts
from loops_nb.widgets import AttemptsTable, RunHealth, TokenCounts


def test_token_counts_per_step_rl() -> None:
    counts = TokenCounts(recent=3)
    for step in range(5):
        counts.on_step(rl_step(step))
    counts.on_step(StepRecord(5, {"loss": 1.0}))  # no tokens/*: ignored
    assert counts.totals == {"tokens/sampled": 5010, "tokens/trained": 3010}
    bundle = counts._repr_mimebundle_()
    assert bundle["text/plain"] == "tokens over 5 steps: sampled 5,010, trained 3,010 (60.1% trained)"
    html = bundle["text/html"]
    assert_static_html(html)
    assert "… 2 earlier steps" in html and ">5,010<" in html and html.count("<tr>") == 1 + 1 + 3 + 1
    lines = str(counts).splitlines()
    assert lines[1].split() == ["step", "sampled", "trained"] and lines[-1].split() == [
        "total",
        "5,010",
        "3,010",
    ]


def test_token_counts_sft() -> None:
    counts = TokenCounts()
    for step in range(3):
        counts.on_step(StepRecord(step, {"tokens/trained": 10, "tokens/total": 30 + 10 * step}))
    assert counts.totals == {"tokens/trained": 30, "tokens/total": 120}
    assert counts.trained_share == 0.25
    assert TokenCounts().summary() == "tokens: no steps yet"


def test_attempts_table_is_bounded_with_transcripts_one_click_away() -> None:
    table = AttemptsTable(max_rows=5, anchor="attempts-x")
    for n in range(12):
        table.on_attempt(rl_attempt(n, reward=1.0, discarded="timeout" if n == 11 else None))
    assert len(table.rows) == 5 and table.seen == 12 and table.discarded == 1
    bundle = table._repr_mimebundle_()
    assert bundle["text/plain"] == "12 attempts, the last 5 shown: mean reward 1, 1 discarded"
    html = bundle["text/html"]
    assert_static_html(html)
    assert html.count("<details>") == 5 and html.count("<summary") == 5
    assert 'id="attempts-x"' in html
    assert html.index(">a11<") < html.index(">a7<")  # newest first
    assert 'title="a11"' in html  # the full id on hover
    assert "discarded: timeout" in html and "detail: timed out" in html
    assert "The answer &lt;is&gt; 11 &amp; 42" in html  # transcripts are escaped
    text = str(table)
    assert text.splitlines()[2].split()[:3] == ["-", "-", "a11"] and "discarded: timeout" in text
    assert "ok · trained" in text  # the hand-fed calls say they trained


def test_attempts_table_clips_long_texts() -> None:
    table = AttemptsTable(max_chars=100)
    record = rl_attempt(1)
    record.text["calls"][0]["completion"] = "x" * 1000
    record.text["calls"][0]["prompt"] = "p" * 500 + "LAST"
    table.on_attempt(record)
    html = table.to_html()
    assert "… 900 more characters" in html and "… 404 earlier characters …" in html and "LAST" in html
    table.add({"attempt": "bare", "reward": 0.0})  # a rollouts.jsonl row, with no transcript
    assert "no transcript recorded" in table.to_html()


def test_run_health_rl_reading_order_and_hints() -> None:
    health = RunHealth(window=6, attempts_anchor="attempts-x")
    for step in range(12):
        health.on_step(rl_step(step, reward=0.1 + 0.05 * step, zero_variance=0.95, discarded=8))
    checks = health.checks()
    assert [c.name for c in checks] == [
        "reward/mean",
        "reward/group_std_mean",
        "discarded",
        "kl/sample_train_v1",
        "transcripts",
    ]
    status = {c.name: c.status for c in checks}
    assert status == {
        "reward/mean": "ok",
        "reward/group_std_mean": "bad",
        "discarded": "bad",
        "kl/sample_train_v1": "ok",
        "transcripts": "info",
    }
    assert (
        "rising" in checks[0].hint and "95% of groups" in checks[1].hint and "timeout ×96" in checks[2].hint
    )
    bundle = health._repr_mimebundle_()
    assert bundle["text/plain"] == "health over 12 steps: 2 ok, 2 bad"
    assert_static_html(bundle["text/html"])
    assert 'href="#attempts-x"' in bundle["text/html"]
    assert str(health).splitlines()[1].lstrip().startswith("✓ reward/mean")


def test_run_health_flat_reward_and_kl_drift() -> None:
    health = RunHealth(window=5)
    for step in range(10):
        health.on_step(rl_step(step, reward=0.5, discarded=0).with_metrics({"kl/sample_train_v1": 0.2}))
    by_name = {c.name: c for c in health.checks()}
    assert by_name["reward/mean"].status == "warn" and "flat" in by_name["reward/mean"].hint
    assert by_name["kl/sample_train_v1"].status == "bad"
    assert by_name["discarded"].status == "ok"


def test_run_health_sft_and_empty() -> None:
    assert RunHealth().checks()[0].status == "wait"
    health = RunHealth(window=4)
    for step, (loss, ev) in enumerate([(2.0, 2.1), (1.8, None), (1.6, 1.9), (1.4, None), (1.2, 2.0)]):
        health.on_step(StepRecord(step, {"loss": loss, **({"eval/loss": ev} if ev else {})}))
    loss, eval_loss = health.checks()
    assert loss.status == "ok" and "falling" in loss.hint
    assert eval_loss.status == "warn" and "overfitting" in eval_loss.hint


def test_attempts_table_columns_survive_the_untrusted_sanitizer() -> None:
    """Saved notebooks are untrusted: Lab drops style declarations it does not allow (``width:7ch`` once ran
    every column together). Every declaration must survive, and the cells must have widths Lab keeps."""
    from lab_sanitizer import stripped, style_kept

    table = AttemptsTable()
    long_id = "hidden-monopoly/g12/a31"
    table.on_attempt(replace(rl_attempt(1), attempt=long_id, task="hidden-monopoly"))
    table.on_rollouts(StepRollouts(4, [{"attempt": long_id, "step": 4, "group": 12, "trained": False}]))
    html = table.to_html()
    assert stripped(html) == []
    widths = re.findall(r"width:([0-9.]+em)", html)
    assert len(widths) >= 2 * 10 and all(style_kept("width", w) for w in widths)
    assert not style_kept("width", "7ch")  # the checker itself knows what Lab drops
    header = re.findall(r'<span title="([a-z]+)"', html)[:10]
    assert header == [
        "step",
        "group",
        "attempt",
        "task",
        "reward",
        "status",
        "policy",
        "calls",
        "tokens",
        "secs",
    ]
    assert f'title="{long_id}"' in html and ">a31<" in html and ">g12<" in html
    assert ">5<" in html  # step 4 in rollouts.jsonl is the panel's step 5
    assert "ok · not trained" in html and "call 1/1 · finish stop · not trained" in html


def test_attempts_say_pending_until_their_step_trains() -> None:
    table = AttemptsTable()
    record = rl_attempt(2)
    record.text["calls"][0]["trained"] = None  # what RLRun sends: unknown when the attempt finishes
    table.on_attempt(record)
    assert "ok · pending" in table.to_html() and "training pending" in table.to_html()
    table.on_rollouts(StepRollouts(0, [{"attempt": "a2", "step": 0, "group": 0, "trained": True}]))
    html = table.to_html()
    assert "ok · trained" in html and "call 1/1 · finish stop · trained" in html


def _run_dir(tmp_path: Path) -> Path:
    root = tmp_path / "run-7"
    (root / "transcripts").mkdir(parents=True)
    rows = [
        {
            "step": s,
            "group": g,
            "attempt": f"t/g{g}/a{a}",
            "task": "t",
            "reward": r,
            "trained": r != 0.5,
            "discarded": "timeout" if (s, g, a) == (1, 1, 1) else None,
            "sampled_tokens": 10 * a + s,
            "seconds": 0.1 * (a + 1),
            "policy_versions": [s],
        }
        for s, g, a, r in [
            (0, 0, 0, 0.5),
            (0, 0, 1, 0.5),
            (1, 0, 0, 1.0),
            (1, 0, 1, 0.0),
            (1, 1, 0, 0.25),
            (1, 1, 1, 0.0),
        ]
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 1, "attem'  # a torn last line
    (root / "rollouts.jsonl").write_text(text)
    calls = [{"prompt": "p", "completion": "the one that scored 1", "trained": True, "finish_reason": "stop"}]
    (root / "transcripts" / "step-000001.json").write_text(
        json.dumps([{"attempt": "t/g0/a0", "calls": calls}])
    )
    return root


def test_every_attempt_of_a_run_sorted_filtered_and_paged(tmp_path: Path) -> None:
    root = _run_dir(tmp_path)
    table = AttemptsTable.from_run(root, sort="reward", page_size=4)
    assert [r["reward"] for r in table.rows] == [1.0, 0.5, 0.5, 0.25]  # highest first
    assert table.summary() == (
        "run-7: attempts 1–4 of 6, sorted by reward (highest first) · page 1 of 2; "
        "AttemptsTable.from_run(..., page=2) for the next"
    )
    html = table.to_html()
    assert_static_html(html)
    assert "the one that scored 1" in html and "call 1/1 · finish stop · trained" in html
    assert html.index(">1<") < html.index(">0.25<")  # the given order, not newest first
    second = AttemptsTable.from_run(root, sort="reward", page=2, page_size=4)
    assert (
        len(second.rows) == 2 and "page 2 of 2" in second.summary() and "for the next" not in second.summary()
    )

    discarded = AttemptsTable.from_run(root, status="discarded")
    assert [r["attempt"] for r in discarded.rows] == ["t/g1/a1"]
    not_trained = AttemptsTable.from_run(root, status="not_trained", sort="tokens", descending=False)
    assert [r["sampled_tokens"] for r in not_trained.rows] == [0, 10]
    by_time = AttemptsTable.from_run(root, sort="time")
    assert by_time.rows[0]["seconds"] == 0.2


def test_bad_paging_input_names_what_to_change(tmp_path: Path) -> None:
    root = _run_dir(tmp_path)
    with pytest.raises(UserError, match="sort by one of step, reward, tokens, time"):
        AttemptsTable.from_run(root, sort="loss")
    with pytest.raises(UserError, match="filter by one of trained, not_trained, discarded, kept"):
        AttemptsTable.from_run(root, status="ok")
    with pytest.raises(UserError, match="has 1 page of 50"):
        AttemptsTable.from_run(root, page=2)
    with pytest.raises(UserError, match="rollouts.jsonl does not exist"):
        AttemptsTable.from_run(tmp_path / "nothing")
