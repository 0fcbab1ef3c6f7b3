"""PORTool's recipe against the paper (issue 31): App. B's split min, and the shifted-outcome variant (not PORTool)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import policy_loss, portool_advantage_terms, split_policy_loss


# ------------------------------------------------------------------------------------------------ split min
def _one_token(ratio: float):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    return logp, old, torch.ones(1, 1, dtype=torch.bool)


def test_split_min_hand_worked():
    """App. B (portool.txt l. 1034-1044): f = min(r A_trj, clip(r) A_trj) + min(r A_fork, clip(r) A_fork).

    One token, r = 1.5, eps = 0.2, A_trj = +1, A_fork = -2 (so A = -1):
      single min: -min(1.5 * -1, 1.2 * -1)              = -(-1.5)          = 1.5, d/dlogp = -A r = 1.5
      split min:  -min(1.5 * 1, 1.2 * 1) - min(-3, -2.4) = -1.2 + 3.0       = 1.8, d/dlogp = 0 + 2 * 1.5 = 3.0
    (the trajectory term is clipped and carries no gradient; the fork term is not clipped).
    """
    logp, old, mask = _one_token(1.5)
    parts = torch.tensor([[[1.0, -2.0]]], dtype=torch.float64)
    split = split_policy_loss(logp, old, parts, mask, clip_eps=0.2)
    (grad,) = torch.autograd.grad(split, logp)
    assert float(split.detach()) == pytest.approx(1.8, abs=1e-12)
    assert float(grad) == pytest.approx(3.0, abs=1e-12)
    logp, old, mask = _one_token(1.5)
    single = policy_loss(logp, old, parts.sum(-1), mask, clip_eps=0.2)
    (grad,) = torch.autograd.grad(single, logp)
    assert float(single.detach()) == pytest.approx(1.5, abs=1e-12) and float(grad) == pytest.approx(
        1.5, abs=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 1.5), min_size=3, max_size=3),
    st.lists(st.floats(-2, 2), min_size=3, max_size=3),
    st.lists(st.floats(-2, 2), min_size=3, max_size=3),
    st.sampled_from(["token-mean", "seq-mean-token-mean"]),
)
def test_split_min_equals_single_min_when_no_token_mixes_signs_under_clipping(ratios, a_trj, a_fork, agg):
    """Spec 9.4 item 9: the two differ only on tokens whose ratio is clipped while the terms' signs differ."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float64))
    old = torch.zeros_like(logp)
    mask = torch.ones_like(logp, dtype=torch.bool)
    parts = torch.tensor([list(zip(a_trj, a_fork, strict=True))], dtype=torch.float64)
    split = float(split_policy_loss(logp, old, parts, mask, clip_eps=0.2, agg=agg))
    single = float(policy_loss(logp, old, parts.sum(-1), mask, clip_eps=0.2, agg=agg))
    clipped = [abs(r - 1) > 0.2 for r in ratios]
    mixed = [a * b < 0 for a, b in zip(a_trj, a_fork, strict=True)]
    if not any(c and m for c, m in zip(clipped, mixed, strict=True)):
        assert split == pytest.approx(single, abs=1e-9)
    else:  # a sum of minima is at most the minimum of the sum: the split loss (its negation) is never smaller
        assert split >= single - 1e-9


def test_split_min_rejects_a_flat_advantage():
    logp, old, mask = _one_token(1.0)
    with pytest.raises(ValueError, match=r"\[B, T, K\]"):
        split_policy_loss(logp, old, torch.zeros(1, 1), mask)


# ------------------------------------------------------------------------------------------------ shifted outcome
# 0 query -> 1 search -> 2 answer (leaf, T = 2)
#                     -> 3 search -> 4 search -> 5 search (cap, leaf, T = 4)
FAIL_PARENTS = [-1, 0, 1, 1, 3, 4]
FAIL_LENGTHS = [0, 40, 30, 40, 40, 40]
FAIL_FMT = [0.0] + [0.25] * 5


def test_shifted_outcome_failing_tree_pushes_nothing():
    """Under the paper's -1, gamma^(T-t) * -1 gives the longer failing branch the larger step reward, so "search
    again" gets a positive fork advantage in a tree with no success. Shifting the outcome to {0, 1, 2}
    (outcome_shift = 1) removes the outcome from such trees: with equal R_fm nothing is pushed."""
    outcomes = {2: -1.0, 5: -1.0}
    paper = portool_advantage_terms(FAIL_PARENTS, FAIL_LENGTHS, outcomes, FAIL_FMT)
    assert paper.fork_advantages[3] > 0 > paper.fork_advantages[2]  # searching on is credited
    shifted = portool_advantage_terms(FAIL_PARENTS, FAIL_LENGTHS, outcomes, FAIL_FMT, outcome_shift=1.0)
    assert shifted.step_rewards[1:] == pytest.approx(FAIL_FMT[1:])  # gamma^k * (-1 + 1) = 0: R_fm only
    for values in shifted.advantages.values():
        assert values == [0.0] * len(values)


def test_shifted_outcome_tree_with_a_success_keeps_its_advantages():
    """A success in the tree: the trajectory term is unchanged (a z-score ignores a shift), and the fork term
    still prefers the branch that succeeded, as in the paper. Hand-worked, gamma = 0.95:
    paper R(answer) = 1 + 0.25 = 1.25, R(search) = -0.857375 + 0.25; shifted 2 + 0.25 = 2.25 and 0 + 0.25."""
    outcomes = {2: 1.0, 5: -1.0}
    paper = portool_advantage_terms(FAIL_PARENTS, FAIL_LENGTHS, outcomes, FAIL_FMT)
    shifted = portool_advantage_terms(FAIL_PARENTS, FAIL_LENGTHS, outcomes, FAIL_FMT, outcome_shift=1.0)
    assert paper.step_rewards[2] == pytest.approx(1.25) and paper.step_rewards[3] == pytest.approx(
        -0.9025 + 0.25
    )
    assert shifted.step_rewards[2] == pytest.approx(2.25) and shifted.step_rewards[3] == pytest.approx(0.25)
    assert shifted.trajectory_advantages == paper.trajectory_advantages
    assert shifted.trajectory_terms == paper.trajectory_terms
    for leaf in paper.advantages:
        assert shifted.fork_advantages[leaf] == pytest.approx(paper.fork_advantages[leaf], abs=1e-6)
        assert shifted.advantages[leaf] == pytest.approx(paper.advantages[leaf], abs=1e-5)
    assert shifted.fork_advantages[2] > 0 > shifted.fork_advantages[3]


@st.composite
def _trees(draw, max_nodes=12):
    n = draw(st.integers(2, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    leaves = [i for i in range(1, n) if i not in set(parents[1:])]
    lengths = [0] + [draw(st.integers(1, 50)) for _ in range(1, n)]
    return parents, leaves, lengths


@settings(max_examples=60, deadline=None)
@given(_trees(), st.sampled_from([-0.25, 0.0, 0.25]), st.booleans())
def test_shifted_outcome_all_failing_trees_push_nothing(tree, fmt, root_is_fork):
    parents, leaves, lengths = tree
    t = portool_advantage_terms(
        parents,
        lengths,
        dict.fromkeys(leaves, -1.0),
        [fmt] * len(parents),
        outcome_shift=1.0,
        root_is_fork=root_is_fork,
    )
    for values in t.advantages.values():
        assert values == pytest.approx([0.0] * len(values), abs=1e-12)
