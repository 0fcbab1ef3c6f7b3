"""critical_action_advantages (carl-critical): tree values, A = V(v) - V(u), update-set rules, ablations."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import critical_action_advantages, critical_action_outcome_advantages

# Spec Sec. 4 worked example (N_0 = 1, N = 3):
#   node 0 = s0, 1 = s1 (a1), 2 = s2 (a2), 3 = L1 (a3, R=0), 4 = s2' (a2'), 5 = L2 (a3', R=1),
#   6 = L4 (a3''', R=0, fork 2 at s2'), 7 = L3 (a1'', R=1, fork 3 at s0)
FIXTURE = [-1, 0, 1, 2, 1, 4, 4, 0]
FIXTURE_REWARDS = {3: 0.0, 5: 1.0, 6: 0.0, 7: 1.0}


@st.composite
def trees_with_rewards(draw, max_nodes=14):
    n = draw(st.integers(2, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    has_child = set(parents[1:])
    leaves = [i for i in range(1, n) if i not in has_child]
    rewards = {leaf: draw(st.sampled_from([0.0, 1.0, 0.5, 0.25])) for leaf in leaves}
    return parents, rewards


def test_spec_worked_example():
    values, adv, update = critical_action_advantages(FIXTURE, FIXTURE_REWARDS)
    assert values[2] == 0.0 and values[4] == 0.5
    assert values[1] == pytest.approx(0.25) and values[0] == pytest.approx(
        0.625
    )  # a leaf average would be 0.5
    expected = {1: -0.375, 7: 0.375, 2: -0.25, 4: 0.25, 5: 0.5, 6: -0.5, 3: 0.0}
    for node, a in expected.items():
        assert adv[node] == pytest.approx(a, abs=1e-12), node
    assert adv[0] == 0.0
    assert update == [False, True, True, False, True, True, True, True]  # a3 excluded
    assert sum(update) == 6  # |D_upd| = 2N with N = 3 forks, |D_roll| = 7


def test_inherit_rule_eq16():
    _, adv, update = critical_action_advantages(FIXTURE, FIXTURE_REWARDS, rule="inherit")
    assert adv[3] == pytest.approx(-0.25)  # a3 inherits a2's advantage
    assert adv[5] == pytest.approx(0.5) and adv[1] == pytest.approx(-0.375)
    assert update == [False] + [True] * 7


def test_inherit_below_single_child_root_is_zero():
    # root -> 1 -> {2, 3}: the root edge has no siblings and no incoming edge (carl-critical-actions.md A13)
    _, adv, _ = critical_action_advantages([-1, 0, 1, 1], {2: 1.0, 3: 0.0}, rule="inherit")
    assert adv[1] == 0.0 and adv[2] == 0.5 and adv[3] == -0.5


def test_forked_parent_rule():
    # N_0 = 1: the states picked for forking were s1, s2' and s0 -> identical to Eq. 13
    counts = {1: 1, 4: 1, 0: 1}
    _, _, literal = critical_action_advantages(FIXTURE, FIXTURE_REWARDS)
    _, _, forked = critical_action_advantages(
        FIXTURE, FIXTURE_REWARDS, rule="forked_parent", fork_counts=counts
    )
    assert forked == literal
    # N_0 = 2 phase-1 chains from the root (nodes 1, 3), then one fork at node 1: the root edges have siblings
    # (Eq. 13 trains them) but the root was never forked (App. C.1: phase-1 actions are not trained).
    parents = [-1, 0, 1, 0, 1]  # 0 -> 1 -> 2; 0 -> 3; 1 -> 4
    rewards = {2: 1.0, 3: 0.0, 4: 0.0}
    # The default is the paper's Eq. 13, not the spec's recommended forked_parent (spec and paper disagree
    # here, and the paper wins): the default trains the unforked root's edges.
    _, _, eq13 = critical_action_advantages(parents, rewards)
    _, _, a1 = critical_action_advantages(parents, rewards, rule="forked_parent", fork_counts=[0, 1, 0, 0, 0])
    assert eq13 == [False, True, True, True, True]
    assert a1 == [False, False, True, False, True]


def test_outcome_ablation_duplicates_per_chain():
    out = critical_action_outcome_advantages(FIXTURE, FIXTURE_REWARDS)
    z = 0.5 / ((1 / 3) ** 0.5 + 1e-6)  # z-score of (0, 1, 0, 1) with the unbiased std
    assert [n for n, _ in out[3]] == [1, 2]  # a3 is not critical
    assert [n for n, _ in out[5]] == [1, 4, 5]
    assert [n for n, _ in out[6]] == [1, 4, 6]
    assert [n for n, _ in out[7]] == [7]
    assert [a for _, a in out[3]] == pytest.approx([-z, -z])
    assert [a for _, a in out[5]] == pytest.approx([z, z, z])
    assert sum(len(v) for v in out.values()) == 9  # a1 trained three times, once per chain
    raw = critical_action_outcome_advantages(FIXTURE, FIXTURE_REWARDS, normalise=False)
    assert raw[5] == [(1, 1.0), (4, 1.0), (5, 1.0)]


@settings(max_examples=80, deadline=None)
@given(trees_with_rewards())
def test_siblings_average_to_zero_and_only_children_get_zero(tree):
    parents, rewards = tree
    values, adv, update = critical_action_advantages(parents, rewards)
    children = {}
    for v, p in enumerate(parents[1:], start=1):
        children.setdefault(p, []).append(v)
    for kids in children.values():
        assert sum(adv[v] for v in kids) == pytest.approx(0.0, abs=1e-12)
        if len(kids) == 1:
            assert adv[kids[0]] == 0.0 and not update[kids[0]]
        else:
            assert all(update[v] for v in kids)
    assert min(rewards.values()) - 1e-12 <= values[0] <= max(rewards.values()) + 1e-12


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=10), st.integers(0, 3))
def test_star_tree_is_reward_minus_mean(rewards, chain):
    # root with n chains of (chain + 1) nodes each and no forks below the root
    parents, leaf_of = [-1], []
    for _ in rewards:
        prev = 0
        for _ in range(chain + 1):
            parents.append(prev)
            prev = len(parents) - 1
        leaf_of.append(prev)
    _, adv, update = critical_action_advantages(parents, dict(zip(leaf_of, rewards, strict=True)))
    mean = sum(rewards) / len(rewards)
    first_steps = [v for v, p in enumerate(parents) if p == 0]
    assert [adv[v] for v in first_steps] == pytest.approx([r - mean for r in rewards], abs=1e-12)
    deeper = [v for v, p in enumerate(parents) if p > 0]
    assert all(adv[v] == 0.0 and not update[v] for v in deeper)


def test_node_ids_need_not_be_topological():
    # same fixture with ids relabelled so that some children come before their parents
    relabel = {0: 0, 1: 7, 2: 3, 3: 1, 4: 5, 5: 2, 6: 6, 7: 4}
    parents = [0] * 8
    for old, p in enumerate(FIXTURE):
        parents[relabel[old]] = -1 if p == -1 else relabel[p]
    rewards = {relabel[k]: v for k, v in FIXTURE_REWARDS.items()}
    _, adv, update = critical_action_advantages(parents, rewards)
    _, adv_ref, update_ref = critical_action_advantages(FIXTURE, FIXTURE_REWARDS)
    for old, new in relabel.items():
        assert adv[new] == pytest.approx(adv_ref[old]) and update[new] == update_ref[old]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rule": "all"}, "rule must be one of"),
        ({"rule": "forked_parent"}, "needs fork_counts"),
        ({"fork_counts": {0: 1}}, "only used by"),
        ({"rule": "forked_parent", "fork_counts": {3: 1}}, "node 3 is a leaf"),
        ({"rule": "forked_parent", "fork_counts": {9: 1}}, "not a node id"),
        ({"rule": "forked_parent", "fork_counts": {1: -1}}, "must be >= 0"),
        ({"rule": "forked_parent", "fork_counts": [1, 1]}, "fork_counts has 2 entries"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        critical_action_advantages(FIXTURE, FIXTURE_REWARDS, **kwargs)


def test_outcome_ablation_rejects_inherit():
    with pytest.raises(ValueError, match="outcome ablation"):
        critical_action_outcome_advantages(FIXTURE, FIXTURE_REWARDS, rule="inherit")
