"""segment_advantages (carl-segment): Eq. 1 / Eq. 6 over segment boundaries, telescoping, Eq. 4 option."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import segment_advantages

unit = st.floats(0.0, 1.0, allow_nan=False)


def test_spec_worked_example_section_3_2():
    # V(s_0)=0.40, V(s~_1)=0.70, V(s_2)=0.50, R=1 -> invoke +0.30, assimilate -0.20, commit +0.50
    adv = segment_advantages([0.40, 0.70, 0.50], 1.0)
    assert adv == pytest.approx([0.30, -0.20, 0.50], abs=1e-12)
    assert sum(adv) == pytest.approx(1.0 - 0.40, abs=1e-12)


def test_no_tool_episode_is_single_commit():
    assert segment_advantages([0.8], 0.0) == pytest.approx([-0.8])


def test_k_tool_calls_give_2k_plus_1_segments():
    values = [0.5, 0.6, 0.4, 0.7, 0.9]  # K = 2: invoke, assimilate, invoke, assimilate, commit
    assert len(segment_advantages(values, 1.0)) == 2 * 2 + 1


def test_lambda_half_by_hand():
    # deltas (0.3, -0.2, 0.5); A_2 = 0.5; A_1 = -0.2 + 0.5 * 0.5 = 0.05; A_0 = 0.3 + 0.5 * 0.05 = 0.325
    assert segment_advantages([0.4, 0.7, 0.5], 1.0, lam=0.5) == pytest.approx([0.325, 0.05, 0.5], abs=1e-12)


def test_per_segment_gamma_by_hand():
    # delta_0 = 0.9 * 0.7 - 0.4 = 0.23; delta_1 = 0.9 * 0.5 - 0.7 = -0.25; delta_2 = 1 - 0.5
    assert segment_advantages([0.4, 0.7, 0.5], 1.0, gamma=0.9) == pytest.approx([0.23, -0.25, 0.5], abs=1e-12)


def test_paper_eq4_token_discount_with_segment_lengths():
    # Paper (App. A, Eq. 4) discounts segment k by gamma^{tau_k}; the per-segment gamma differs when
    # gamma < 1 and the paper wins when segment lengths are given.
    g = 0.99
    adv = segment_advantages([0.4, 0.7, 0.5], 1.0, gamma=g, lam=0.5, segment_lengths=[3, 5, 2])
    d0 = g**3 * 0.7 - 0.4
    d1 = g**5 * 0.5 - 0.7
    d2 = 1.0 - 0.5  # the episode ends: V(b_{N+1}) = 0
    a2 = d2
    a1 = d1 + g**5 * 0.5 * a2
    a0 = d0 + g**3 * 0.5 * a1
    assert adv == pytest.approx([a0, a1, a2], abs=1e-12)
    assert segment_advantages([0.4, 0.7, 0.5], 1.0, segment_lengths=[3, 5, 2]) == segment_advantages(
        [0.4, 0.7, 0.5], 1.0
    )


def test_tensor_input():
    adv = segment_advantages(torch.tensor([0.4, 0.7, 0.5], dtype=torch.float64), torch.tensor(1.0))
    assert adv == pytest.approx([0.3, -0.2, 0.5], abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(unit, min_size=1, max_size=15), st.sampled_from([0.0, 1.0]))
def test_lambda0_telescopes_and_is_bounded(values, reward):
    adv = segment_advantages(values, reward, lam=0.0, gamma=1.0)
    assert sum(adv) == pytest.approx(reward - values[0], abs=1e-9)
    assert all(-1.0 <= a <= 1.0 for a in adv)


@settings(max_examples=60, deadline=None)
@given(st.lists(unit, min_size=1, max_size=15), st.floats(-1.0, 1.0))
def test_lambda1_is_reward_minus_value(values, reward):
    adv = segment_advantages(values, reward, lam=1.0, gamma=1.0)
    assert adv == pytest.approx([reward - v for v in values], abs=1e-9)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([], 1.0), {}, "at least 1"),
        (([0.5, float("nan")], 1.0), {}, r"boundary_values\[1\] must be finite"),
        (([0.5], float("nan")), {}, "reward must be finite"),
        (([0.5], float("inf")), {}, "reward must be finite"),
        (([0.5], 1.0), {"lam": 1.5}, "lam must lie"),
        (([0.5], 1.0), {"gamma": -0.5}, "gamma must lie"),
        (([0.5, 0.6], 1.0), {"segment_lengths": [3]}, "segment_lengths has 1 entries"),
        (([0.5, 0.6], 1.0), {"segment_lengths": [3, 0]}, r"segment_lengths\[1\] = 0"),
        (([0.5, 0.6], 1.0), {"segment_lengths": [3, 1.5]}, r"segment_lengths\[1\] must be an int"),
        (("0.5", 1.0), {}, "sequence of numbers"),
        (([[0.5]], 1.0), {}, "real number"),
    ],
)
def test_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        segment_advantages(*args, **kwargs)


def test_segment_rewards_add_to_the_intermediate_td_errors():
    # V = (0.4, 0.7, 0.5), R = 1 with turn rewards r_0 = 0.1, r_1 = -0.05 (e.g. TIPS shaping)
    adv = segment_advantages([0.4, 0.7, 0.5], 1.0, segment_rewards=[0.1, -0.05])
    assert adv == pytest.approx([0.3 + 0.1, -0.2 - 0.05, 0.5])
    # telescoping at lam = 0: sum = R - V(b_0) + sum of the intermediate rewards
    assert sum(adv) == pytest.approx(1.0 - 0.4 + 0.05)
    # lam = 1: A_k = (rewards from k on) - V(b_k)
    adv1 = segment_advantages([0.4, 0.7, 0.5], 1.0, lam=1.0, segment_rewards=[0.1, -0.05])
    assert adv1 == pytest.approx([1.05 - 0.4, 0.95 - 0.7, 1.0 - 0.5])


def test_segment_rewards_length_is_checked():
    with pytest.raises(ValueError, match="segment_rewards"):
        segment_advantages([0.4, 0.7, 0.5], 1.0, segment_rewards=[0.1])
