"""grpo_advantages: group z-scores with the unbiased std, Dr.GRPO, degenerate groups, dtypes, bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import grpo_advantages
from agentcredit.credit._stats import zscore


def test_hand_computed_two_groups():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), ["a", "a", "b", "b"])
    # mean 0.5, unbiased std sqrt(0.5) in both groups
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv.tolist() == pytest.approx([expected, -expected, expected, -expected], abs=1e-12)


def test_three_member_group_by_hand():
    adv = grpo_advantages(torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64), [7, 7, 7], eps=0.0)
    # mean 1, unbiased var ((1 + 1 + 0) / 2) = 1
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0], abs=1e-12)


def test_dr_grpo_only_centres():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 5.0, 5.0]), ["q", "q", "r", "r"], scale=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_interleaved_and_tensor_group_ids():
    rewards = torch.tensor([1.0, 5.0, 0.0, 3.0], dtype=torch.float64)
    by_list = grpo_advantages(rewards, ["x", "y", "x", "y"])
    by_tensor = grpo_advantages(rewards, torch.tensor([0, 1, 0, 1]))
    assert torch.equal(by_list, by_tensor)
    assert by_list[0] == -by_list[2] and by_list[1] == -by_list[3]


@pytest.mark.parametrize("scale", [True, False])
def test_singleton_and_equal_groups_get_zero(scale):
    # 0.1 * 3 / 3 != 0.1 in floating point: the all-equal rule must not rely on R - mean being exactly 0
    rewards = torch.tensor([0.1, 0.1, 0.1, 4.0, 1.0, 0.0])
    adv = grpo_advantages(rewards, ["eq", "eq", "eq", "solo", "pair", "pair"], scale=scale)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] > 0 > adv[5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.5], dtype=dtype), [0, 0, 0])
    assert adv.dtype == dtype


def test_list_rewards_and_empty_batch():
    assert grpo_advantages([1.0, 0.0], ["a", "a"]).dtype == torch.get_default_dtype()
    assert grpo_advantages(torch.zeros(0), []).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, -1.0, 0.25, 2.0])),
        min_size=1,
        max_size=24,
    )
)
def test_matches_direct_torch_std(pairs):
    groups = [g for g, _ in pairs]
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    adv = grpo_advantages(rewards, groups)
    for g in set(groups):
        idx = torch.tensor([i for i, h in enumerate(groups) if h == g])
        r = rewards[idx]
        if len(r) < 2 or bool((r == r[0]).all()):
            expected = torch.zeros_like(r)
        else:
            expected = (r - r.mean()) / (torch.std(r) + 1e-6)
        torch.testing.assert_close(adv[idx], expected, rtol=0, atol=1e-12)
        assert zscore(r.tolist(), 1e-6) == pytest.approx(adv[idx].tolist(), abs=1e-12)


@pytest.mark.parametrize(
    ("rewards", "groups", "match"),
    [
        (torch.tensor([1.0, 0.0]), ["a"], "group_ids has 1 labels"),
        (torch.tensor([1.0, float("nan")]), ["a", "a"], r"rewards must be finite; rewards\[1\]"),
        (torch.tensor([1.0, float("inf")]), ["a", "a"], "rewards must be finite"),
        (torch.tensor([1, 0]), ["a", "a"], "floating-point"),
        (torch.zeros(2, 2), ["a", "a"], "1-D"),
        (torch.tensor([1.0, 0.0]), [["a"], ["a"]], "hashable"),
        (torch.tensor([1.0, 0.0]), "ab", "sequence"),
    ],
)
def test_bad_input(rewards, groups, match):
    with pytest.raises(ValueError, match=match):
        grpo_advantages(rewards, groups)


def test_bad_eps():
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages(torch.tensor([1.0, 0.0]), [0, 0], eps=-1.0)
