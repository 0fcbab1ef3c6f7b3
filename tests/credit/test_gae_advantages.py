"""gae_advantages: masked GAE over policy tokens (observation tokens skipped, as in verl's multi-turn GAE)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import gae_advantages


def test_hand_computed_row_skips_observation():
    # policy, policy, observation, observation, policy; gamma = 0.9, lam = 0.5
    rewards = torch.tensor([[0.0, 0.5, 7.0, 0.0, 1.0]], dtype=torch.float64)  # 7.0 sits on an observation
    values = torch.tensor([[0.2, 0.4, 9.0, 9.0, 0.6]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    # delta_3 = 1 - 0.6 = 0.4;  delta_2 = 0.5 + 0.9 * 0.6 - 0.4 = 0.64;  delta_1 = 0.9 * 0.4 - 0.2 = 0.16
    # A_3 = 0.4;  A_2 = 0.64 + 0.45 * 0.4 = 0.82;  A_1 = 0.16 + 0.45 * 0.82 = 0.529
    assert adv.tolist()[0] == pytest.approx([0.529, 0.82, 0.0, 0.0, 0.4], abs=1e-12)
    assert ret.tolist()[0] == pytest.approx([0.729, 1.22, 0.0, 0.0, 1.0], abs=1e-12)


def test_lam_zero_is_td_error():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.3, 0.6, 0.8]])
    adv, _ = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.0)
    assert adv.tolist()[0] == pytest.approx([0.3, 0.2, 0.2])


def _reference(rewards, values, mask, gamma, lam):
    """The spec's verl pseudo-code (TIPS spec Sec. 3.6), token by token, in Python floats."""
    out_a, out_r = [], []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True):
        next_v, last_a = 0.0, 0.0
        a_row = [0.0] * len(r_row)
        for t in range(len(r_row) - 1, -1, -1):
            m = float(m_row[t])
            delta = r_row[t] + gamma * next_v - v_row[t]
            a = delta + gamma * lam * last_a
            next_v = m * v_row[t] + (1 - m) * next_v
            last_a = m * a + (1 - m) * last_a
            a_row[t] = last_a if m else 0.0
        out_a.append(a_row)
        out_r.append([a + v if m else 0.0 for a, v, m in zip(a_row, v_row, m_row, strict=True)])
    return out_a, out_r


rows = st.integers(1, 3)
cols = st.integers(1, 9)


@settings(max_examples=30, deadline=None)
@given(
    st.data(),
    rows,
    cols,
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_matches_verl_reference(data, b, t, gamma, lam):
    vals = st.floats(-2.0, 2.0, allow_nan=False)
    rewards = torch.tensor(
        data.draw(st.lists(st.lists(vals, min_size=t, max_size=t), min_size=b, max_size=b))
    )
    values = torch.tensor(data.draw(st.lists(st.lists(vals, min_size=t, max_size=t), min_size=b, max_size=b)))
    mask = torch.tensor(
        data.draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    )
    rewards, values = rewards.double(), values.double()
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    ref_a, ref_r = _reference(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(ref_a, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(ret, torch.tensor(ref_r, dtype=torch.float64), rtol=0, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3, allow_nan=False), st.booleans()), min_size=1, max_size=12))
def test_lam1_gamma1_zero_values_is_reward_to_go(tokens):
    rewards = torch.tensor([[r for r, _ in tokens]], dtype=torch.float64)
    mask = torch.tensor([[m for _, m in tokens]])
    adv, ret = gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=1.0)
    for t, (_, m) in enumerate(tokens):
        to_go = sum(r for r, keep in tokens[t:] if keep) if m else 0.0
        assert adv[0, t].item() == pytest.approx(to_go, abs=1e-9)
        assert ret[0, t].item() == pytest.approx(to_go, abs=1e-9)


def test_masked_positions_are_ignored_even_nan_values():
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    values = torch.tensor([[0.5, float("nan"), 0.25]])
    adv, ret = gae_advantages(rewards, values, torch.tensor([[1, 0, 1]]), gamma=1.0, lam=1.0)
    assert adv.tolist() == [[0.5, 0.0, 0.75]]
    assert ret.tolist() == [[1.0, 0.0, 1.0]]


def test_row_without_policy_tokens_is_zero():
    adv, ret = gae_advantages(torch.ones(2, 3), torch.ones(2, 3), torch.tensor([[0, 0, 0], [1, 1, 1]]))
    assert adv[0].tolist() == [0.0, 0.0, 0.0] and ret[0].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].tolist() == [2.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "mask", [torch.tensor([[True, False, True]]), torch.tensor([[1, 0, 1]]), torch.tensor([[1.0, 0.0, 1.0]])]
)
def test_bool_and_01_masks_agree(mask):
    adv, ret = gae_advantages(torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[0.5, 0.5, 0.5]]), mask, lam=0.9)
    expected_a, expected_r = gae_advantages(
        torch.tensor([[0.1, 0.2, 0.3]]),
        torch.tensor([[0.5, 0.5, 0.5]]),
        torch.tensor([[True, False, True]]),
        lam=0.9,
    )
    assert torch.equal(adv, expected_a) and torch.equal(ret, expected_r)


@pytest.mark.parametrize(
    ("dr", "dv", "out"),
    [
        (torch.float32, torch.float32, torch.float32),
        (torch.float64, torch.float64, torch.float64),
        (torch.float32, torch.float64, torch.float64),
    ],
)
def test_dtypes(dr, dv, out):
    adv, ret = gae_advantages(torch.zeros(1, 2, dtype=dr), torch.zeros(1, 2, dtype=dv), torch.ones(1, 2))
    assert adv.dtype == out and ret.dtype == out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"token_rewards": torch.zeros(1, 3), "values": torch.zeros(1, 2)}, "values has shape"),
        ({"token_rewards": torch.zeros(3), "values": torch.zeros(3), "mask": torch.ones(3)}, "2 dimension"),
        ({"mask": torch.tensor([[1, 2]])}, "only 0 and 1"),
        ({"mask": torch.ones(1, 3)}, "mask has shape"),
        ({"token_rewards": torch.tensor([[float("nan"), 0.0]])}, r"token_rewards\[\(0, 0\)\]"),
        ({"values": torch.tensor([[0.0, float("inf")]])}, "values must be finite"),
        ({"token_rewards": torch.zeros(1, 2, dtype=torch.long)}, "floating-point"),
        ({"gamma": 1.5}, r"gamma must lie in \[0, 1\]"),
        ({"lam": -0.1}, "lam must lie"),
    ],
)
def test_bad_input(kwargs, match):
    args = {"token_rewards": torch.zeros(1, 2), "values": torch.zeros(1, 2), "mask": torch.ones(1, 2)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gae_advantages(**args)
