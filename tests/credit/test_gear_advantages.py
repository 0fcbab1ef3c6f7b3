"""gear_advantages: rKL normalisation, divergence-aware segments, Eqs. 3-5, the ablation switches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import gear_advantages, gear_details

# Spec Sec. 4.4 golden example: ten policy tokens, teacher log-probs 0 so that rKL = student log-prob.
RKL = [0.0, 0.2, 3.0, 0.1, 0.0, 0.5, 10.0, 0.3, 0.2, 0.0]
H = [0.5, 0.4, 0.8, 0.9, 1.5, 0.3, 0.6, 0.7, 1.0, 0.2]


def run(advantage, mask=None, dtype=torch.float64, **kwargs):
    mask = torch.ones(10) if mask is None else mask
    kwargs.setdefault("turn_head_tokens", 0)  # the spec's worked example is the paper's scan
    return gear_details(
        advantage,
        torch.tensor(RKL, dtype=dtype),
        torch.zeros(10, dtype=dtype),
        torch.tensor(H, dtype=dtype),
        mask,
        **kwargs,
    )


def test_golden_example_positive():
    d = run(1.5)
    assert d.rkl_norm.tolist() == pytest.approx([0, 0.02, 0.3, 0.01, 0, 0.05, 1.0, 0.03, 0.02, 0], abs=1e-15)
    assert d.rkl_norm[6].item() == 1.0  # exact min-max, no epsilon in the denominator
    assert d.segments == [(2, 4), (6, 8)]
    assert d.w_kl.tolist() == pytest.approx([0, 0.02, 0.3, 0.3, 0.3, 0.05, 1.0, 1.0, 1.0, 0], abs=1e-15)
    assert d.weights.tolist() == pytest.approx(
        [1.1, 1.096, 1.04, 1.04, 1.04, 1.09, 0.9, 0.9, 0.9, 1.1], abs=1e-12
    )
    expected = [1.65, 1.644, 1.56, 1.56, 1.56, 1.635, 1.35, 1.35, 1.35, 1.65]
    assert d.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    assert d.segment_id.tolist() == [-1, -1, 0, 0, 0, -1, 1, 1, 1, -1]
    assert d.trigger_rate == pytest.approx(0.2) and d.frac_in_segments == pytest.approx(0.6)


def test_golden_example_negative():
    d = run(-1.5)
    assert d.weights.tolist() == pytest.approx(
        [0.9, 0.904, 0.96, 0.96, 0.96, 0.91, 1.1, 1.1, 1.1, 0.9], abs=1e-12
    )
    expected = [-1.35, -1.356, -1.44, -1.44, -1.44, -1.365, -1.65, -1.65, -1.65, -1.35]
    assert d.advantages.tolist() == pytest.approx(expected, abs=1e-12)


def test_golden_example_masked_variant():
    # the paper's scan runs over the policy tokens: a segment may run across an observation (gear.md A5, the default)
    mask = torch.ones(10)
    mask[4] = mask[5] = 0  # observation tokens
    d = run(1.5, mask)
    assert d.segments == [(2, 9)]  # the spike at 6 is swallowed by the segment opened at 2
    assert d.advantages.tolist() == pytest.approx(
        [1.65, 1.644, 1.56, 1.56, 0, 0, 1.56, 1.56, 1.56, 1.56], abs=1e-12
    )


def test_golden_example_float32_through_public_function():
    out = gear_advantages(
        1.5, torch.tensor(RKL), torch.zeros(10), torch.tensor(H), torch.ones(10, dtype=torch.bool)
    )
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx(
        [1.65, 1.644, 1.56, 1.56, 1.56, 1.635, 1.35, 1.35, 1.35, 1.65], abs=1e-6
    )


def test_break_at_observation():
    # ours, off by default: the segment opened at 2 closes before the observation, and the spike at 6 opens its own
    mask = torch.ones(10)
    mask[4] = mask[5] = 0
    d = run(1.5, mask, break_at_observation=True)
    assert d.turn.tolist() == [0, 0, 0, 0, -1, -1, 1, 1, 1, 1]
    assert d.segments == [(2, 3), (6, 8)]
    assert d.advantages.tolist() == pytest.approx(
        [1.65, 1.644, 1.56, 1.56, 0, 0, 1.35, 1.35, 1.35, 1.65], abs=1e-12
    )


def test_ablation_switches():
    assert run(1.5, segmentation="none").w_kl.tolist() == pytest.approx(run(1.5).rkl_norm.tolist())
    kl_only = run(1.5, segmentation="kl_only")
    assert kl_only.segments == [(2, 5), (6, 9)]
    assert kl_only.w_kl.tolist() == pytest.approx([0, 0.02, 0.3, 0.3, 0.3, 0.3, 1, 1, 1, 1], abs=1e-15)
    entropy_only = run(1.5, segmentation="entropy_only")
    assert entropy_only.segments == [(0, 2), (3, 4), (5, 6), (7, 9)]
    assert entropy_only.w_kl.tolist() == pytest.approx(
        [0, 0, 0, 0.01, 0.01, 0.05, 0.05, 0.03, 0.03, 0.03], abs=1e-15
    )
    starts = torch.zeros(10, dtype=torch.bool)
    starts[3] = starts[7] = True
    tool = run(1.5, segmentation="tool_call", tool_call_starts=starts)
    assert tool.segments == [(0, 2), (3, 6), (7, 9)]
    assert tool.w_kl.tolist() == pytest.approx([0, 0, 0, 0.01, 0.01, 0.01, 0.01, 0.03, 0.03, 0.03], abs=1e-15)
    # trailing 8-token mean entropy never exceeds 1.5 * 0.8: the segment opened at 2 runs to the end
    window = run(1.5, segmentation="entropy_window")
    assert window.segments == [(2, 9)]
    assert run(1.5, segmentation="entropy_window", entropy_window=1).segments == run(1.5).segments


def test_clamp_max_normalisation():
    student = torch.tensor([-2.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    common = (student, torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), torch.ones(4))
    assert gear_details(1.0, *common).rkl_norm.tolist() == pytest.approx([0, 0.5, 0.75, 1.0])
    assert gear_details(1.0, *common, normalisation="clamp_max").rkl_norm.tolist() == pytest.approx(
        [0, 0, 0.5, 1.0]
    )


@pytest.mark.parametrize("advantage", [1.5, -2.0, 0.0])
def test_degenerate_constant_rkl(advantage):
    d = gear_details(advantage, torch.full((5,), 0.3), torch.zeros(5), torch.ones(5), torch.ones(5))
    assert d.rkl_norm.tolist() == [0.0] * 5 and d.segments == []
    sign = (advantage > 0) - (advantage < 0)
    assert d.weights.tolist() == pytest.approx([1 + 0.5 * 0.2 * sign] * 5)
    assert d.advantages.tolist() == pytest.approx([advantage * (1 + 0.1 * sign)] * 5)


def test_empty_mask_gives_zeros():
    out = gear_advantages(1.0, torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3))
    assert out.tolist() == [0.0, 0.0, 0.0]


def literal_algorithm_1(a, rkl, h, mask, lam_kl, lam_h, alpha, break_at_observation=False, head=0):
    """A literal transcription of Algorithm 1 over the compacted action tokens, independent of the module; with
    ``break_at_observation`` a segment also ends at the last token of its turn (a turn ends where the mask has a
    gap), and the first ``head`` tokens of a turn open no segment (ours, issue 48)."""
    toks = [i for i, m in enumerate(mask) if m]
    if not toks:
        return [0.0] * len(mask)
    vals = [rkl[i] for i in toks]
    ent = [h[i] for i in toks]
    lo, hi = min(vals), max(vals)
    r = [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in vals]
    n = len(toks)
    turn = [0] * n
    for j in range(1, n):
        turn[j] = turn[j - 1] + (toks[j] - toks[j - 1] > 1)
    first_of_turn = {turn[j]: j for j in reversed(range(n))}
    w_kl = list(r)
    t = 0
    while t < n:
        if r[t] > lam_kl and t - first_of_turn[turn[t]] >= head:
            t_start = t
            last = n - 1
            if break_at_observation:
                last = max(u for u in range(n) if turn[u] == turn[t_start])
            t_end = next((u for u in range(t_start + 1, last + 1) if ent[u] > lam_h * ent[t_start]), last)
            for u in range(t_start, t_end + 1):
                w_kl[u] = r[t_start]
            t = t_end + 1
        else:
            t = t + 1
    sign = (a > 0) - (a < 0)
    beta = 1 - 0.5 * alpha
    out = [0.0] * len(mask)
    for j, i in enumerate(toks):
        out[i] = (alpha * (0.5 + (0.5 - w_kl[j]) * sign) + beta) * a
    return out


token = st.tuples(st.floats(-5, 5, allow_nan=False), st.floats(0, 3, allow_nan=False), st.booleans())


@settings(max_examples=80, deadline=None)
@given(
    st.lists(token, min_size=1, max_size=30),
    st.floats(-3, 3, allow_nan=False),
    st.floats(0, 1),
    st.floats(1, 2),
    st.booleans(),
    st.integers(0, 3),
)
def test_matches_literal_algorithm_and_invariants(tokens, a, lam_kl, lam_h, break_at_observation, head):
    rkl = [x for x, _, _ in tokens]
    h = [y for _, y, _ in tokens]
    mask = [m for _, _, m in tokens]
    d = gear_details(
        a,
        torch.tensor(rkl, dtype=torch.float64),
        torch.zeros(len(tokens), dtype=torch.float64),
        torch.tensor(h, dtype=torch.float64),
        torch.tensor(mask),
        lambda_kl=lam_kl,
        lambda_h=lam_h,
        break_at_observation=break_at_observation,
        turn_head_tokens=head,
    )
    expected = literal_algorithm_1(a, rkl, h, mask, lam_kl, lam_h, 0.2, break_at_observation, head)
    assert d.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    on = torch.tensor(mask)
    # closed form (beta = 1 - 0.5 alpha) and bounds of W
    closed = a + 0.2 * abs(a) * (0.5 - d.w_kl)
    torch.testing.assert_close(d.advantages[on], closed[on], rtol=0, atol=1e-12)
    assert bool((d.weights[on] >= 0.9 - 1e-12).all() and (d.weights[on] <= 1.1 + 1e-12).all())
    # outside segments r <= lambda_KL, but for a turn's head tokens (which open none); onsets > lambda_KL and never
    # at a turn's head; segments are disjoint and ordered; with break_at_observation none crosses an observation
    turn = d.turn
    pos = torch.zeros_like(turn)
    for i in range(len(tokens)):
        if mask[i]:
            earlier = [j for j in range(i) if mask[j] and turn[j] == turn[i]]
            pos[i] = len(earlier)
    outside = on & (d.segment_id < 0) & (pos >= head)
    assert bool((d.rkl_norm[outside] <= lam_kl).all())
    last_end = -1
    for s, e in d.segments:
        assert s > last_end and d.rkl_norm[s] > lam_kl and pos[s] >= head
        if break_at_observation:
            assert turn[s] == turn[e] and bool(on[s : e + 1].all())
        last_end = e
    # turns count the observations: a new turn exactly after each gap in the mask
    idx = [i for i in range(len(tokens)) if mask[i]]
    assert [int(turn[i]) for i in idx] == [
        sum(idx[k] - idx[k - 1] > 1 for k in range(1, j + 1)) for j in range(len(idx))
    ]
    assert bool((d.advantages[~on] == 0).all())


@settings(max_examples=40, deadline=None)
@given(st.lists(token, min_size=1, max_size=20), st.floats(-3, 3, allow_nan=False))
def test_alpha_zero_returns_advantage_unchanged(tokens, a):
    mask = torch.tensor([m for _, _, m in tokens])
    out = gear_advantages(
        a,
        torch.tensor([x for x, _, _ in tokens]),
        torch.zeros(len(tokens)),
        torch.tensor([y for _, y, _ in tokens]),
        mask,
        alpha=0.0,
    )
    assert out[mask].tolist() == pytest.approx([a] * int(mask.sum()), abs=1e-6)
    assert out[~mask].tolist() == [0.0] * int((~mask).sum())


def test_masked_values_do_not_matter():
    mask = torch.tensor([1, 1, 0, 1, 0, 1])
    student = torch.tensor([0.1, 2.0, 0.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    entropy = torch.tensor([1.0, 0.5, 0.0, 2.0, 0.0, 0.1], dtype=torch.float64)
    base = gear_advantages(1.0, student, torch.zeros(6, dtype=torch.float64), entropy, mask)
    student2, entropy2 = student.clone(), entropy.clone()
    student2[2], student2[4], entropy2[2], entropy2[4] = float("nan"), 99.0, float("inf"), -5.0
    other = gear_advantages(1.0, student2, torch.zeros(6, dtype=torch.float64), entropy2, mask)
    assert torch.equal(base, other)


@pytest.mark.parametrize(
    "mask",
    [torch.tensor([1, 0, 1, 1]), torch.tensor([True, False, True, True]), torch.tensor([1.0, 0.0, 1.0, 1.0])],
)
def test_bool_and_01_masks_agree(mask):
    args = (torch.tensor([0.0, 1.0, 2.0, 0.5]), torch.zeros(4), torch.ones(4))
    expected = gear_advantages(1.0, *args, torch.tensor([True, False, True, True]))
    assert torch.equal(gear_advantages(1.0, *args, mask), expected)


def test_mixed_dtypes_promote():
    out = gear_advantages(
        1.0, torch.zeros(3), torch.zeros(3, dtype=torch.float64), torch.ones(3), torch.ones(3)
    )
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"teacher_logp": torch.zeros(4)}, "teacher_logp has shape"),
        (
            {
                "student_logp": torch.zeros(1, 3),
                "teacher_logp": torch.zeros(1, 3),
                "entropy": torch.zeros(1, 3),
            },
            "1 dimension",
        ),
        ({"mask": torch.tensor([0, 2, 1])}, "only 0 and 1"),
        (
            {"student_logp": torch.tensor([0.0, 0.0, float("nan")])},
            r"student_logp must be finite; student_logp\[2\]",
        ),
        ({"entropy": torch.tensor([1.0, 1.0, -0.5])}, r"entropy must be >= 0 on policy tokens; entropy\[2\]"),
        ({"advantage": float("nan")}, "advantage must be finite"),
        ({"segmentation": "random"}, "segmentation must be one of"),
        ({"normalisation": "zscore"}, "normalisation must be one of"),
        ({"segmentation": "tool_call"}, "needs tool_call_starts"),
        ({"segmentation": "tool_call", "tool_call_starts": torch.tensor([0, 1, 0])}, "mask == 0"),
        ({"tool_call_starts": torch.tensor([1, 0, 0])}, "only used by"),
        ({"segmentation": "kl_only", "break_at_observation": True}, "break_at_observation applies"),
        ({"turn_head_tokens": -1}, "turn_head_tokens must be an int >= 0"),
        ({"turn_starts": torch.tensor([0, 1, 0])}, r"turn_starts\[1\] is True on a token with mask == 0"),
        ({"entropy_window": 0}, "entropy_window must be a positive int"),
        ({"alpha": -0.1}, "alpha and lambda_h must be >= 0"),
        ({"student_logp": torch.tensor([0, 1, 2])}, "floating-point"),
    ],
)
def test_bad_input(change, match):
    args = {
        "advantage": 1.0,
        "student_logp": torch.tensor([0.0, 1.0, 0.5]),
        "teacher_logp": torch.zeros(3),
        "entropy": torch.ones(3),
        "mask": torch.tensor([1, 0, 1]),
    }
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(ValueError, match=match):
        gear_advantages(**args, **kwargs)
