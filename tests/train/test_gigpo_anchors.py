"""GiGPO in the trainer: anchor states are whole contexts, shared by tree prefixes and by identical independent
actions alike, and the routed advantages are gigpo_advantages on those anchors."""

from __future__ import annotations

import pytest

from agentcredit.config import load_config
from agentcredit.credit import gigpo_advantages
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.advantages import anchor_states, compute_advantages
from agentcredit.train.batch import build_batch
from agentcredit.train.signals import Signals


def pol(ids):
    return Segment(ids, role="policy", kind="step", logprobs=[-1.0] * len(ids), entropies=[1.0] * len(ids))


def obs(ids):
    return Segment(ids, role="observation", kind="observation")


def three_episodes() -> tuple[RolloutTree, list[int]]:
    """Episodes A and B write the same first action (two nodes, same tokens) and see the same result; A then
    answers right, B wrong. C answers at once, right. D forks from A's state (a shared tree prefix), wrong."""
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    a_state = tree.add(obs([20]), tree.add(pol([10]), 0))
    a = tree.add(pol([11]), a_state)
    b = tree.add(pol([12]), tree.add(obs([20]), tree.add(pol([10]), 0)))
    c = tree.add(pol([13]), 0)
    d = tree.add(pol([14]), a_state)
    for leaf, reward in ((a, 1.0), (b, 0.0), (c, 1.0), (d, 0.0)):
        tree.set_reward(leaf, reward)
    return tree, [a, b, c, d]


def test_anchor_states_are_the_tokens_before_each_step():
    tree, (a, b, c, d) = three_episodes()
    first_a, first_b = tree.parent(tree.parent(a)), tree.parent(tree.parent(b))
    assert first_a != first_b  # two nodes ...
    assert anchor_states(tree, [first_a, a]) == [(1, 2), (1, 2, 10, 20)]
    assert anchor_states(tree, [first_b, b]) == anchor_states(tree, [first_a, a])  # ... one state
    assert anchor_states(tree, [c]) == [(1, 2)]
    assert anchor_states(tree, [first_a, d])[1] == (1, 2, 10, 20)  # the fork shares A's prefix


def test_routed_advantages_are_gigpo_on_those_anchors():
    tree, leaves = three_episodes()
    batch = build_batch([tree])
    cfg = load_config("gigpo-arith-tools").algorithm
    result = compute_advantages(cfg, batch, [tree], Signals())
    by_leaf = {t.leaf: t for t in batch.trajectories}
    rewards = [1.0, 0.0, 1.0, 0.0]
    anchors = [["p", "s"], ["p", "s"], ["p"], ["p", "s"]]  # A, B, D share the state after action 10
    expected = gigpo_advantages(rewards, ["q"] * 4, anchors, gamma=0.95, step_weight=1.0, eps=cfg.gigpo.eps)
    for leaf, values in zip(leaves, expected, strict=True):
        traj = by_leaf[leaf]
        row = traj.rows[0]
        got = [
            float(result.advantages[row][(batch.segment_ids[row] == node) & batch.policy_mask[row]][0])
            for node in traj.policy_nodes
        ]
        assert got == pytest.approx(values.tolist(), abs=1e-6)
    # 4 first steps from the prompt + 3 second steps from one state grouped, C's only step is in the first group
    assert result.stats["gigpo/grouped_step_fraction"] == 1.0 and result.stats["gigpo/step_groups"] == 2
