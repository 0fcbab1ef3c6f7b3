"""policy_loss: the clipped surrogate, its three aggregations, gradient sign, masking, dual clip, stats."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import aggregation_weights, policy_loss, policy_loss_stats

# Row 0: ratios (1.0, 1.5, 0.5), A = (1, 1, -1).  Row 1: ratios (1.1, 0.7, -), A = (-2, 2, 5), last token masked.
RATIOS = [[1.0, 1.5, 0.5], [1.1, 0.7, 3.0]]
ADV = [[1.0, 1.0, -1.0], [-2.0, 2.0, 5.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
# per-token -min(rA, clip(r, 0.8, 1.2) A):  row 0: -1, -1.2 (clipped), 0.8 (clipped);  row 1: 2.2, -1.4
TOKEN_LOSS = [[-1.0, -1.2, 0.8], [2.2, -1.4]]


def batch(dtype=torch.float64):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.0]], dtype=dtype)
    logp = (old + torch.log(torch.tensor(RATIOS, dtype=dtype))).requires_grad_(True)
    return logp, old, torch.tensor(ADV, dtype=dtype), torch.tensor(MASK)


def test_token_mean_by_hand():
    logp, old, adv, mask = batch()
    loss = policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(sum(TOKEN_LOSS[0] + TOKEN_LOSS[1]) / 5, abs=1e-12)  # -0.12


def test_seq_mean_token_mean_by_hand():
    logp, old, adv, mask = batch()
    loss = policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((sum(TOKEN_LOSS[0]) / 3 + sum(TOKEN_LOSS[1]) / 2) / 2, abs=1e-12)


def test_segment_mean_by_hand():
    logp, old, adv, mask = batch()
    segments = torch.tensor([[0, 0, 1], [0, 1, 1]])
    loss = policy_loss(logp, old, adv, mask, agg="segment-mean", segment_ids=segments)
    row0 = (-1.0 - 1.2) / 2 + 0.8  # two segments, each a token mean, summed
    row1 = 2.2 + (-1.4)  # the masked token of segment 1 does not count
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-12)  # 0.25


def test_gradient_sign_and_values():
    logp, old, adv, mask = batch()
    policy_loss(logp, old, adv, mask).backward()
    grad = logp.grad.tolist()
    # d loss / d logp = -A * r / 5 where the unclipped term is active, 0 where clipping holds it
    assert grad[0] == pytest.approx([-1.0 / 5, 0.0, 0.0], abs=1e-12)
    assert grad[1] == pytest.approx([2.2 / 5, -1.4 / 5, 0.0], abs=1e-12)
    # minimising moves logp up for A > 0 and down for A < 0
    assert grad[0][0] < 0 and grad[1][0] > 0 and grad[1][1] < 0


def test_on_policy_gradient_is_weighted_advantage():
    # With r = 1 the seq-mean-token-mean gradient is -A / (rows * tokens of the row) (PORTool spec Sec. 9.4 item 9)
    adv = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    policy_loss(logp, logp.detach(), adv, mask, agg="seq-mean-token-mean").backward()
    expected = [[-1.0 / 6, 2.0 / 6, -3.0 / 6], [-0.5 / 2, 0.0, 0.0]]
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected]


def test_split_min_equals_single_min_without_clipping():
    logp = torch.log(torch.tensor([[1.05, 0.9, 1.1]], dtype=torch.float64))
    old = torch.zeros(1, 3, dtype=torch.float64)
    a_trj = torch.tensor([[0.5, -1.0, 0.2]], dtype=torch.float64)
    a_fork = torch.tensor([[-2.0, 3.0, 0.7]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    single = policy_loss(logp, old, a_trj + a_fork, mask, agg="seq-mean-token-mean")
    split = policy_loss(logp, old, a_trj, mask, agg="seq-mean-token-mean") + policy_loss(
        logp, old, a_fork, mask, agg="seq-mean-token-mean"
    )
    assert single.item() == pytest.approx(split.item(), abs=1e-12)


def test_dual_clip_caps_negative_advantage_loss():
    logp = torch.log(torch.tensor([[5.0, 5.0]], dtype=torch.float64))
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)
    plain = policy_loss(logp, old, adv, torch.ones(1, 2))
    capped = policy_loss(logp, old, adv, torch.ones(1, 2), dual_clip=3.0)
    assert plain.item() == pytest.approx((5.0 - 1.2) / 2)
    assert capped.item() == pytest.approx((3.0 - 1.2) / 2)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "segment-mean"])
def test_empty_mask_is_zero_with_a_graph(agg):
    logp = torch.zeros(2, 3, requires_grad=True)
    ids = torch.zeros(2, 3, dtype=torch.long) if agg == "segment-mean" else None
    loss = policy_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), agg=agg, segment_ids=ids)
    assert loss.item() == 0.0
    loss.backward()
    assert logp.grad.tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "segment-mean"])
def test_garbage_off_the_mask_does_not_leak(agg):
    logp, old, adv, mask = batch()
    with torch.no_grad():
        logp[1, 2] = 1e4  # exp would overflow
        old[1, 2] = float("nan")
        adv[1, 2] = float("inf")
    ids = torch.tensor([[0, 0, 1], [0, 1, 1]]) if agg == "segment-mean" else None
    loss = policy_loss(logp, old, adv, mask, agg=agg, segment_ids=ids)
    loss.backward()
    assert math.isfinite(loss.item()) and bool(torch.isfinite(logp.grad).all())
    assert logp.grad[1, 2].item() == 0.0


@pytest.mark.parametrize(
    "mask",
    [torch.tensor(MASK), torch.tensor(MASK, dtype=torch.bool), torch.tensor(MASK, dtype=torch.float32)],
)
def test_bool_and_01_masks_agree(mask):
    logp, old, adv, _ = batch()
    assert policy_loss(logp, old, adv, mask).item() == pytest.approx(sum(TOKEN_LOSS[0] + TOKEN_LOSS[1]) / 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    logp, old, adv, mask = batch(dtype)
    loss = policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    assert loss.dtype == dtype and loss.dim() == 0


def test_stats():
    logp, old, adv, mask = batch()
    stats = policy_loss_stats(logp, old, adv, mask)
    ratios = [1.0, 1.5, 0.5, 1.1, 0.7]
    assert stats["clip_fraction"] == pytest.approx(2 / 5)  # row 0 tokens 1 and 2
    assert stats["approx_kl"] == pytest.approx(sum(-math.log(r) for r in ratios) / 5, abs=1e-12)
    assert stats["approx_kl_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 5, abs=1e-12)
    assert stats["ratio_max"] == pytest.approx(1.5) and stats["ratio_min"] == pytest.approx(0.5)
    assert stats["tokens"] == 5.0
    assert policy_loss_stats(logp, old, adv, torch.zeros(2, 3))["tokens"] == 0.0


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"agg": "sum"}, "agg must be one of"),
        ({"agg": "segment-mean"}, "needs segment_ids"),
        ({"segment_ids": torch.zeros(2, 3, dtype=torch.long)}, "only used by"),
        ({"agg": "segment-mean", "segment_ids": torch.zeros(2, 3)}, "integer tensor"),
        ({"agg": "segment-mean", "segment_ids": torch.zeros(2, 2, dtype=torch.long)}, "shape"),
        ({"old_logp": torch.zeros(2, 2)}, "old_logp has shape"),
        (
            {
                "logp": torch.zeros(6),
                "old_logp": torch.zeros(6),
                "advantages": torch.zeros(6),
                "mask": torch.ones(6),
            },
            "2 dimension",
        ),
        ({"mask": torch.full((2, 3), 2)}, "only 0 and 1"),
        ({"advantages": torch.full((2, 3), float("nan"))}, "advantages must be finite"),
        ({"clip_eps": 0.0}, "clip_eps must lie"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1"),
    ],
)
def test_bad_input(change, match):
    logp, old, adv, mask = batch()
    args = {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask}
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(ValueError, match=match):
        policy_loss(**args, **kwargs)


def test_segment_labels_are_arbitrary_integers():
    logp, old, adv, mask = batch()
    compact = policy_loss(
        logp, old, adv, mask, agg="segment-mean", segment_ids=torch.tensor([[0, 0, 1], [0, 1, 1]])
    )
    labels = torch.tensor([[5, 5, -3], [100, 7, 7]], dtype=torch.int32)
    assert policy_loss(logp, old, adv, mask, agg="segment-mean", segment_ids=labels).item() == pytest.approx(
        compact.item(), abs=1e-15
    )


# ---------------------------------------------------------------------------------------------- aggregation weights


def _random_batch(seed: int, B: int = 5, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1 - 1.0
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    seg = torch.randint(0, 3, (B, T), generator=g)
    return logp, old, adv, mask, seg


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["token-mean", "seq-mean-token-mean", "segment-mean"]))
def test_weights_reproduce_each_aggregation_and_split_over_microbatches(seed, agg):
    logp, old, adv, mask, seg = _random_batch(seed)
    seg_kw = {"segment_ids": seg} if agg == "segment-mean" else {}
    full = policy_loss(logp, old, adv, mask, agg=agg, **seg_kw)
    w = aggregation_weights(mask, agg, **seg_kw)
    assert float(policy_loss(logp, old, adv, mask, weights=w)) == pytest.approx(float(full), abs=1e-12)
    # microbatches of rows, each weighted with the minibatch-wide weights, sum to the minibatch loss
    parts = sum(
        policy_loss(logp[r], old[r], adv[r], mask[r], weights=w[r])
        for r in (slice(0, 2), slice(2, 3), slice(3, 5))
    )
    assert float(parts) == pytest.approx(float(full), abs=1e-12)


def test_sequence_ids_treat_split_rows_as_one_sequence():
    # one trajectory stored as two rows (two exact contexts) aggregates like the single concatenated row
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 0]], dtype=torch.bool)
    seg = torch.tensor([[0, 0, 0], [1, 1, 2], [0, 0, 0]])
    w = aggregation_weights(mask, "seq-mean-token-mean", sequence_ids=torch.tensor([7, 7, 3]))
    # sequence 7 has 4 tokens, sequence 3 has 1; two sequences
    assert w.tolist() == [[1 / 8, 1 / 8, 0], [0, 1 / 8, 1 / 8], [1 / 2, 0, 0]]
    w = aggregation_weights(mask, "segment-mean", segment_ids=seg, sequence_ids=torch.tensor([7, 7, 3]))
    # sequence 7: segments 0 (2 tokens), 1 (1 token), 2 (1 token); sequence 3: segment 0 (1 token)
    assert w.tolist() == [[1 / 4, 1 / 4, 0], [0, 1 / 2, 1 / 2], [1 / 2, 0, 0]]


def test_weights_shape_is_checked():
    logp, old, adv, mask, _ = _random_batch(0)
    with pytest.raises(ValueError, match="weights"):
        policy_loss(logp, old, adv, mask, weights=torch.ones(2, 2))
    with pytest.raises(ValueError, match="sequence_ids"):
        aggregation_weights(mask, "seq-mean-token-mean", sequence_ids=torch.zeros(3, dtype=torch.long))
