"""GRPO advantages, datum construction and token batching."""

from __future__ import annotations

import pytest

from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.rl.datums import sequence_datums, token_batches
from loops_nb.rl.grpo import group_advantages


def test_advantage_is_reward_minus_group_mean_without_std_division():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv.advantages == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert adv.mean == 0.25
    assert not adv.zero_variance
    assert sum(adv.advantages) == pytest.approx(0.0)
    # Scaling rewards scales advantages (no std normalisation).
    assert group_advantages([10.0, 0.0, 0.0, 0.0]).advantages == pytest.approx([7.5, -2.5, -2.5, -2.5])


def test_equal_rewards_carry_no_signal():
    adv = group_advantages([0.5, 0.5, 0.5])
    assert adv.zero_variance and adv.advantages == [0.0, 0.0, 0.0]
    assert group_advantages([]).advantages == []


def call(prompt, completion, version=0):
    return ModelCall(prompt, completion, [-0.1 * (i + 1) for i in range(len(completion))], version, "stop")


def test_datums_train_only_sampled_tokens_with_their_logprobs():
    cap = TokenCapture()
    cap.record(call([1, 2, 3], [4, 5]))
    (d,) = sequence_datums(cap.sequences(), 0.5, "a")
    wire = d.to_datum()
    assert wire.model_input.to_ints() == [1, 2, 3, 4]
    inputs = wire.loss_fn_inputs
    assert inputs["target_tokens"].data == [2, 3, 4, 5]
    assert inputs["mask"].data == [0.0, 0.0, 1.0, 1.0]
    assert inputs["logprobs"].data == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert inputs["advantages"].data == [0.0, 0.0, 0.5, 0.5]
    assert d.trained_tokens == 2


def test_multi_turn_calls_that_extend_form_one_sequence():
    cap = TokenCapture()
    cap.record(call([1, 2], [3, 4]))
    cap.record(call([1, 2, 3, 4, 9, 9], [5, 6], version=1))
    (seq,) = cap.sequences()
    assert seq.tokens == [1, 2, 3, 4, 9, 9, 5, 6]
    assert seq.sampled == [False, False, True, True, False, False, True, True]
    assert seq.policy_versions == [0, 1]
    assert not cap.breaks


def test_a_turn_that_does_not_extend_starts_a_new_sequence_and_is_counted():
    cap = TokenCapture()
    cap.record(call([1, 2], [3, 4]))
    cap.record(call([1, 2, 7, 9], [5]))  # history re-rendered: 3, 4 became 7
    seqs = cap.sequences()
    assert [s.tokens for s in seqs] == [[1, 2, 3, 4], [1, 2, 7, 9, 5]]
    assert cap.breaks["template_rewrote_history"] == 1  # no renderer said why: counted as the template's


def test_token_batches_respect_the_budget_and_keep_everything():
    cap = TokenCapture()
    for i in range(5):
        cap.record(call([100 + i] * 5, [1, 2, 3, 4, 5]))  # 10 tokens each, none extends the other
    datums = sequence_datums(cap.sequences(), 1.0, "a")
    batches = list(token_batches(datums, 20))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert sum(len(b) for b in batches) == 5
