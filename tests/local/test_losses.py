"""Wire parsing (`datum_wire.py`) and the loss maths (`losses.py`), on hand-made tensors: no model needed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from baseten.loops import Datum

from loops_nb.local.bad_request import BadRequest
from loops_nb.local.datum_wire import parse_datums, resolve_loss_config, tensor_data
from loops_nb.local.losses import LOSSES, LossBatch, LossOutput, collate, micro_batches


def compute_loss(loss_fn: str, batch: LossBatch, loss_fn_config: dict | None) -> LossOutput:
    """`loss_fn` on `batch` as the trainer runs it: its config checked and merged over the defaults."""
    return LOSSES[loss_fn](batch, resolve_loss_config(loss_fn, loss_fn_config))


def td(data: list, dtype: str = "float32", shape: list[int] | None = None) -> dict:
    return {"data": data, "dtype": dtype, "shape": shape if shape is not None else [len(data)]}


def datum(tokens: list[int], targets: list[int] | None = None, **inputs: dict) -> dict:
    targets = targets if targets is not None else [t + 1 for t in tokens]
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "loss_fn_inputs": {"target_tokens": td(targets, "int64"), **inputs},
        "routed_experts_ref": None,
    }


def parse(data: list[dict], loss_fn: str, **limits: int) -> list:
    """`parse_datums` of wire datums, validated into the SDK's `Datum` first as the server does."""
    return parse_datums([Datum.model_validate(d) for d in data], loss_fn, **limits)


# ------------------------------------------------------------------------------------------ wire


def test_missing_target_tokens_names_datum_and_key() -> None:
    bad = datum([1, 2, 3])
    del bad["loss_fn_inputs"]["target_tokens"]
    with pytest.raises(BadRequest, match=r"data\[1\]\.loss_fn_inputs: cross_entropy needs 'target_tokens'"):
        parse([datum([1, 2]), bad], "cross_entropy")


def test_weights_length_mismatch_message() -> None:
    d = datum(list(range(9)), weights=td([1.0] * 7))
    with pytest.raises(BadRequest) as err:
        parse([datum([1]), datum([2]), datum([3]), d], "cross_entropy")
    assert str(err.value) == "data[3].loss_fn_inputs['weights']: length 7 does not match model_input length 9"


def test_unknown_loss_lists_valid_ones() -> None:
    with pytest.raises(BadRequest, match="cross_entropy, importance_sampling, ppo, cispo, dro, dppo, dpo"):
        parse([datum([1])], "grpo")


def test_unknown_config_key_and_defaults() -> None:
    assert resolve_loss_config("ppo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_loss_config("dpo", {"beta": 0.5})["beta"] == 0.5
    with pytest.raises(BadRequest, match=r"unknown key\(s\) \['clip_ratio'\]; valid keys: clip_low"):
        resolve_loss_config("ppo", {"clip_ratio": 0.2})
    with pytest.raises(BadRequest, match="valid keys: none"):
        resolve_loss_config("importance_sampling", {"beta": 1.0})
    with pytest.raises(BadRequest, match="must be a boolean"):
        resolve_loss_config("cross_entropy", {"skip_token_normalization": 1})


def test_nested_tensor_data_and_nulls() -> None:
    # TensorData.from_list keeps nested data (and labels it float32 even for token ids).
    d = datum(
        [1, 2, 3],
        weights=td([[1.0, None], [0.5, 0.5], [None, 2.0]], shape=[3, 2]),
    )
    d["loss_fn_inputs"]["target_tokens"] = td([[2, 5], [3, 6], [4, -100]], "float32", [3, 2])
    d["loss_fn_inputs"]["mask"] = td([1, 1, 1])  # unknown for CE: tolerated and ignored
    (p,) = parse([d], "cross_entropy", vocab_size=10)
    assert p.target_tokens.tolist() == [[2, 5], [3, 6], [4, -100]]
    assert p.weights.tolist() == [[1.0, 0.0], [0.5, 0.5], [0.0, 2.0]]


def test_shape_and_range_errors() -> None:
    with pytest.raises(BadRequest, match=r"3 values do not fill shape \[2\]"):
        parse([datum([1, 2], weights=td([1.0, 1.0, 1.0], shape=[2]))], "cross_entropy")
    with pytest.raises(BadRequest, match=r"data\[0\]\.model_input: empty"):
        parse([datum([], [])], "cross_entropy")
    with pytest.raises(BadRequest, match=r"token 200 at position 1 is outside the vocabulary \[0, 128\)"):
        parse([datum([1, 200])], "cross_entropy", vocab_size=128)
    with pytest.raises(BadRequest, match=r"target_tokens'\]: token 128 must be \[0, 128\) or -100"):
        parse([datum([1, 127])], "cross_entropy", vocab_size=128)
    with pytest.raises(BadRequest, match="image chunks need a vision model"):
        parse([{"model_input": {"chunks": [{"type": "image", "data": "", "format": "png",
                                                   "expected_tokens": 4}]}}], "cross_entropy")  # fmt: skip
    with pytest.raises(BadRequest, match="even number of datums"):
        parse([datum([1])] * 3, "dpo")
    with pytest.raises(BadRequest, match="only supported by cross_entropy"):
        rl = datum([1], logprobs=td([0.0]), advantages=td([1.0]))
        rl["loss_fn_inputs"]["target_tokens"] = td([[2, 3]], "int64", [1, 2])
        parse([rl], "ppo")
    with pytest.raises(BadRequest, match=r"data\[0\]\.loss_fn_inputs: ppo needs 'logprobs'"):
        parse([datum([1, 2], advantages=td([1.0]))], "ppo")
    with pytest.raises(BadRequest, match="null or non-finite value at active position 1"):
        parse([datum([1, 2], logprobs=td([None, None]), advantages=td([0.0, 1.0]))], "ppo")


def test_advantage_scalar_broadcasts_and_null_q_where_inactive() -> None:
    d = datum([1, 2, 3], logprobs=td([None, -1.0, -2.0]), advantages=td([0.5]), mask=td([0.0, 1.0, 1.0]))
    (p,) = parse([d], "importance_sampling")
    assert p.advantages is not None and p.logprobs is not None
    assert p.advantages.tolist() == [0.5, 0.5, 0.5]
    assert p.logprobs.tolist() == [0.0, -1.0, -2.0]
    assert p.weights.tolist() == [0.0, 1.0, 1.0]


def test_tensor_data_writes_null_for_nan() -> None:
    out = tensor_data(torch.tensor([[1.5, math.nan], [0.0, -2.0]])).model_dump(mode="json")
    assert out == {"data": [1.5, None, 0.0, -2.0], "dtype": "float32", "shape": [2, 2]}
    json.dumps(out, allow_nan=False)
    assert tensor_data(torch.tensor([3, 4])).dtype == "int64"


# ----------------------------------------------------------------------------------------- losses

LP = [-0.5, -1.0, -2.0, -0.1]
Q = [-1.2, -0.8, -2.0, -1.5]


def rl_batch(adv: list[float], weights: list[float] | None = None) -> LossBatch:
    lp = torch.tensor([LP], dtype=torch.float64, requires_grad=True)
    return LossBatch(
        lp=lp,
        valid=torch.ones(1, 4, dtype=torch.bool),
        weights=torch.tensor([weights or [1.0] * 4], dtype=torch.float64),
        logprobs=torch.tensor([Q], dtype=torch.float64),
        advantages=torch.tensor([adv], dtype=torch.float64),
    )


def reference(loss_fn: str, lp: float, q: float, a: float, cfg: dict) -> float:
    """Per-token objectives written out from the protocol table (§5.4), in plain floats."""
    r = math.exp(lp - q)
    if loss_fn == "importance_sampling":
        return -r * a
    if loss_fn == "ppo":
        clipped = min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"])
        return -min(r * a, clipped * a)
    if loss_fn == "cispo":
        return -min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"]) * lp * a
    if loss_fn == "dro":
        return -(lp * a - 0.5 * cfg["beta"] * (lp - q) ** 2)
    assert loss_fn == "dppo"
    delta = math.exp(lp) - math.exp(q)
    drop = (a > 0 and delta > cfg["dppo_mask_high"]) or (a < 0 and delta < -cfg["dppo_mask_low"])
    return -(0.0 if drop else 1.0) * cfg["adv_tau"] * a * r + cfg["kl_tau"] * (lp - q) ** 2


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo", "dro", "dppo"])
def test_rl_losses_match_reference(loss_fn: str) -> None:
    adv = [1.0, -2.0, 0.0, 0.7]
    weights = [1.0, 0.5, 1.0, 1.0]
    cfg = resolve_loss_config(loss_fn, None)
    out = compute_loss(loss_fn, rl_batch(adv, weights), None)
    expected = sum(
        w * reference(loss_fn, lp, q, a, cfg) for lp, q, a, w in zip(LP, Q, adv, weights, strict=True) if a
    )
    assert out.loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert out.count == 3
    assert out.logprobs.tolist() == [[-0.5, -1.0, 0.0, -0.1]]  # 0.0 where A = 0


def test_advantage_shape_one_through_parse() -> None:
    data = [
        datum([1, 2], logprobs=td([-1.0, -1.0]), advantages=td([2.0])),
        datum([3, 4, 5], logprobs=td([-1.0, -1.0, -1.0]), advantages=td([0.0])),
    ]
    batch = collate(parse(data, "importance_sampling"), torch.device("cpu"), torch.float64)
    batch.lp = torch.full(batch.lp.shape, -0.5, dtype=torch.float64)
    out = compute_loss("importance_sampling", batch, None)
    assert float(out.loss) == pytest.approx(2 * -math.exp(0.5) * 2.0)
    assert out.count == 2
    assert out.logprobs[1].tolist() == [0.0, 0.0, 0.0]


def test_ppo_clipping_stops_gradient_but_cispo_does_not() -> None:
    # r = exp(-0.5 + 1.2) ≈ 2.01 > 1.2 with A > 0: ppo takes the clipped branch (no gradient),
    # cispo keeps a gradient of −clip(r)·A = −1.2.
    adv = [1.0, 0.0, 0.0, 0.0]
    b = rl_batch(adv)
    compute_loss("ppo", b, None).loss.backward()
    assert b.lp.grad is not None and b.lp.grad[0, 0] == 0.0
    b = rl_batch(adv)
    compute_loss("cispo", b, None).loss.backward()
    assert b.lp.grad is not None and float(b.lp.grad[0, 0]) == pytest.approx(-1.2)
    # A < 0 with r = exp(1.4) above the high clip: the unclipped r·A is the min, so the gradient stays.
    b = rl_batch([0.0, 0.0, 0.0, -1.0])
    compute_loss("ppo", b, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).loss.backward()
    assert float(b.lp.grad[0, 3]) == pytest.approx(math.exp(1.4))


def test_cross_entropy_weights_ignore_and_k_targets() -> None:
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    b = LossBatch(lp=lp, valid=torch.tensor([[True, True, False]]), weights=torch.tensor([[1.0, 0.0, 1.0]]))
    out = compute_loss("cross_entropy", b, None)
    assert float(out.loss) == 1.0 and out.count == 1
    # Every valid target's logprob comes back, weight 0 or not; only the invalid (-100) one is NaN.
    assert out.logprobs[0, :2].tolist() == [-1.0, -2.0] and out.logprobs[0, 2].isnan()
    skip = compute_loss("cross_entropy", b, {"skip_token_normalization": True})
    assert skip.logprobs[0, :2].tolist() == [-1.0, -2.0] and skip.logprobs[0, 2].isnan()
    lp_k = torch.tensor([[[-1.0, -2.0], [-3.0, -4.0]]])
    bk = LossBatch(
        lp=lp_k, valid=torch.ones(1, 2, 2, dtype=torch.bool), weights=torch.tensor([[[0.5, 0.5], [0.0, 0.0]]])
    )
    out = compute_loss("cross_entropy", bk, None)
    assert float(out.loss) == pytest.approx(1.5) and out.count == 1


def test_dpo_pairs() -> None:
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, -1.0, -1.0], [-0.5, -0.5, 0.0], [-0.2, -0.2, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0], [-2.0, -1.0, -1.0], [-0.5, -0.5, 0.0], [-0.1, -0.1, 0.0]])
    weights = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    b = LossBatch(lp=lp, valid=torch.ones(4, 3, dtype=torch.bool), weights=weights, ref_logprobs=ref)
    cfg = {"beta": 0.5, "label_smoothing": 0.1}
    out = compute_loss("dpo", b, cfg)

    def pair(c: int, r: int) -> float:
        s = [float(((lp[i] - ref[i]) * weights[i]).sum()) for i in (c, r)]
        z = 0.5 * (s[0] - s[1])
        return -0.9 * math.log(1 / (1 + math.exp(-z))) - 0.1 * math.log(1 / (1 + math.exp(z)))

    assert float(out.loss) == pytest.approx(pair(0, 1) + pair(2, 3))
    assert out.count == 2
    assert out.logprobs[0, 2].isnan() and out.logprobs[1, 2] == -1.0


def test_micro_batches_respect_budget_and_pairs() -> None:
    lengths = [5, 50, 7, 8, 40, 3]
    batches = micro_batches(lengths, 64)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(max(lengths[i] for i in b) * len(b) <= 64 or len(b) == 1 for b in batches)
    for b in micro_batches(lengths, 20, group=2):
        assert all(b[j] % 2 == 0 and b[j + 1] == b[j] + 1 for j in range(0, len(b), 2))
