"""What `check` reports is what trains: its counts, per-row statuses and preview come from the rows the trainer
gets, token for token.

The property test writes random files of tokenized and chat rows (weights on the first token only, on every
token, on none; assistant turns trained or not, first or later), plans them as `loops check` and `loops run`
do (`SFTData.load`), and compares the report with the datums the plan's batches become.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sft_fixtures import write_jsonl

from loops_nb.sft.batching import SFTData
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.data import RefusedRow, parse_row
from loops_nb.sft.evaluation import example_datum
from loops_nb.sft.targets import chat_targets
from loops_nb.widgets.target_preview import TargetPreview

FIRST_TOKEN = "the first token can never train"


def _datum_targets(example: Any) -> int:
    """Targets with a weight in the datum the trainer receives for ``example``."""
    return sum(1 for w in example_datum(example).loss_fn_inputs["weights"].data if w > 0)


@pytest.mark.parametrize(
    "row", [{"input_ids": [1], "weights": [1]}, {"input_ids": [1, 5, 6, 2], "weights": [1, 0, 0, 0]}]
)
def test_a_row_weighted_only_on_its_first_token_is_refused_with_the_reason(row: dict, smollm2: Any) -> None:
    result = parse_row(row, 3)
    assert isinstance(result, RefusedRow) and result.row_number == 3
    assert (
        result.reason.startswith("weights: only input_ids[0] has a weight") and FIRST_TOKEN in result.reason
    )


def test_a_weight_on_the_first_token_is_not_counted_or_shown_as_trained(smollm2: Any) -> None:
    result = chat_targets(smollm2).render(parse_row({"input_ids": [1, 5, 6, 2], "weights": [1, 1, 1, 1]}, 1))
    (example,) = result.examples  # type: ignore[union-attr]
    assert example.n_trained == 3 == _datum_targets(example)
    assert example.weights == [0.0, 1.0, 1.0, 1.0]
    preview = TargetPreview(example, smollm2)
    assert preview.n_trained == 3 and str(preview).endswith("(4 tokens, 3 trained)")


# -- the property ----------------------------------------------------------------------------------------------

_WORDS = st.sampled_from(["Paris", "the", "capital", "is", "hello", "?", "sunny", "22", "fox", "\n"])
_TEXT = st.lists(_WORDS, min_size=1, max_size=6).map(" ".join)


@st.composite
def _tokenized(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))
    weights = draw(
        st.one_of(
            st.lists(st.sampled_from([0, 0, 1, 0.5]), min_size=n, max_size=n),
            st.just([1] + [0] * (n - 1)),  # only the first token
            st.just([1] * n),  # every token, the first included
        )
    )
    return {"input_ids": ids, "weights": weights}


@st.composite
def _chat(draw: st.DrawFn) -> dict:
    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_TEXT)})
    if draw(st.integers(0, 5)) == 0:  # an opening assistant turn: refused when it trains
        messages.append(
            {"role": "assistant", "content": draw(_TEXT), "weight": draw(st.sampled_from([0, 1]))}
        )
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_TEXT)})
        turn: dict = {"role": "assistant", "content": draw(_TEXT)}
        weight = draw(st.sampled_from([None, 0, 1]))
        if weight is not None:
            turn["weight"] = weight
        messages.append(turn)
    return {"messages": messages}


def _config(train: Path, **training: Any) -> SFTConfig:
    return SFTConfig.model_validate(
        {
            "recipe": "sft",
            "model": {"max_seq_len": 64},
            "data": {"train": str(train), "eval_fraction": 0.0},
            "training": {"batch_tokens": 48, **training},
        }
    )


@given(rows=st.lists(st.one_of(_tokenized(), _chat()), min_size=1, max_size=14), epochs=st.integers(1, 2))
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_checks_counts_are_what_the_trainer_receives(rows: list[dict], epochs: int, smollm2: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write_jsonl(Path(folder) / "train.jsonl", rows)
        data = SFTData.load(_config(path, epochs=epochs), smollm2)
        report = data.report

        per_row_examples: Counter[int] = Counter()
        per_row_trained: Counter[int] = Counter()
        per_row_tokens: Counter[int] = Counter()
        per_epoch: Counter[int] = Counter()
        for batch in data.plan.batches():
            for example in data.train.load(batch.indices, data.targets):
                per_epoch[batch.epoch] += 1
                if batch.epoch == 0:
                    per_row_examples[example.row_number] += 1
                    per_row_trained[example.row_number] += _datum_targets(example)
                    per_row_tokens[example.row_number] += example.n_tokens

        # The totals check prints are one epoch of what the trainer gets; every epoch gets all of it.
        assert report.n_examples == len(data.train) == sum(per_row_examples.values())
        assert all(per_epoch[e] == report.n_examples for e in range(epochs)) or not report.n_examples
        assert report.trained_tokens == sum(per_row_trained.values()) == sum(data.train.trained)
        assert report.tokens == sum(per_row_tokens.values()) == sum(data.train.tokens)
        # Row by row: a row reported as training trains exactly that; a refused row sends nothing.
        table = report.rows
        for line in table.itertuples():
            assert line.n_examples == per_row_examples[line.row_number], line
            assert line.trained_tokens == per_row_trained[line.row_number], line
            assert line.tokens == per_row_tokens[line.row_number], line
            assert (line.status == "refused") == (line.n_examples == 0), line
            if line.status != "refused":
                assert line.trained_tokens > 0, line
        # The preview paints green exactly the tokens that train.
        for sample in report.samples:
            shown = TargetPreview(sample, smollm2, max_tokens=10_000)
            assert shown.n_trained == per_row_trained[sample.row_number]
