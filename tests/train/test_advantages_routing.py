"""The advantage router puts the credit functions' outputs on the right tokens (hand-built trees)."""

from __future__ import annotations

import pytest
import torch

from agentcredit.config import AlgorithmConfig
from agentcredit.credit import (
    critical_action_advantages,
    gae_advantages,
    gear_advantages,
    portool_advantages,
    segment_advantages,
    tips_turn_rewards,
)
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.advantages import compute_advantages, decision_tree
from agentcredit.train.batch import build_batch, segment_spans
from agentcredit.train.signals import Signals


def pol(ids, kind="step", fmt=0.0):
    return Segment(
        ids,
        role="policy",
        kind=kind,
        logprobs=[-1.0] * len(ids),
        entropies=[1.0] * len(ids),
        info={"format_reward": fmt},
    )


def obs(ids, transient=False):
    return Segment(ids, role="observation", kind="observation", transient=transient)


def carl_episode(reward: float) -> RolloutTree:
    """prompt | invoke | raw output (transient) | assimilate | commit — carl-segment's replacement mode."""
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    leaf = tree.add_path(
        [
            pol([10, 11], "invoke"),
            obs([20, 21], transient=True),
            pol([30], "assimilate"),
            pol([40, 41, 42], "commit"),
        ]
    )
    tree.set_reward(leaf, reward)
    return tree


def decisions(tree):
    """The decision tree of a rollout tree, each step's policy node (-1 for the question) and each leaf's reward
    by decision node."""
    dt, step_of = decision_tree(tree)
    policy_node = [-1] + [n for n in range(1, len(tree)) if tree.segment(n).is_policy]
    return dt, step_of, policy_node, {step_of[leaf]: r for leaf, r in tree.rewards().items()}


def test_decision_tree_collapses_observations_into_their_step():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(pol([2]), 0)
    o = tree.add(obs([3]), a)
    b = tree.add(pol([4]), o)  # two actions from the state after a's observation
    c = tree.add(pol([5]), o)
    d = tree.add(pol([6]), 0)
    for leaf, r in ((b, 1.0), (c, 0.0), (d, 1.0)):
        tree.set_reward(leaf, r)
    dt, step_of, policy_node, leaf_rewards = decisions(tree)
    assert dt.parents == (-1, 0, 1, 1, 0)
    assert policy_node == [-1, a, b, c, d]
    assert step_of[o] == 1 and {leaf: step_of[leaf] for leaf in (b, c, d)} == {b: 2, c: 3, d: 4}
    assert leaf_rewards == {2: 1.0, 3: 0.0, 4: 1.0}


def test_segment_estimator_on_replacement_views_matches_the_credit_function():
    trees = [carl_episode(1.0)]
    batch = build_batch(trees)
    assert len(batch.trajectories[0].rows) == 2  # the raw output is only in the first view
    values = torch.zeros(batch.input_ids.shape)
    spans = segment_spans(batch, batch.trajectories[0])
    for (r, first, _), v in zip(spans, [0.4, 0.7, 0.5], strict=True):
        values[r, first] = v
    cfg = AlgorithmConfig(method="carl-segment", carl_segment={"lam": 0.0})
    out = compute_advantages(cfg, batch, trees, Signals(values=values))
    expected = segment_advantages([0.4, 0.7, 0.5], 1.0)  # +0.3, -0.2, +0.5 (carl-segment.md §3.2)
    for (r, _, _), node, a in zip(spans, batch.trajectories[0].policy_nodes, expected, strict=True):
        sel = batch.policy_mask[r] & (batch.segment_ids[r] == node)
        assert torch.allclose(out.advantages[r, sel], torch.tensor(a, dtype=torch.float32))
    assert out.value_mask.sum() == 3 and out.returns[out.value_mask].tolist() == [1.0, 1.0, 1.0]


def test_tips_shaping_on_the_boundary_critic_adds_turn_rewards_to_the_td_errors():
    trees = [carl_episode(1.0)]
    batch = build_batch(trees)
    values = torch.zeros(batch.input_ids.shape)
    spans = segment_spans(batch, batch.trajectories[0])
    for (r, first, _), v in zip(spans, [0.4, 0.7, 0.5], strict=True):
        values[r, first] = v
    potentials = [[-3.0, -1.0, -0.5]]
    cfg = AlgorithmConfig(method="carl-segment+tips", carl_segment={"lam": 0.0})
    out = compute_advantages(cfg, batch, trees, Signals(values=values, potentials=potentials, alpha=0.2))
    turn = tips_turn_rewards(potentials[0], 1.0, alpha=0.2)
    expected = segment_advantages([0.4, 0.7, 0.5], turn[-1], segment_rewards=turn[:-1])
    got = [float(out.advantages[r, first]) for r, first, _ in spans]
    assert got == pytest.approx(expected, abs=1e-6)
    # telescoping: R - V(b_0) - alpha * Phi(S_0)
    assert sum(got) == pytest.approx(1.0 - 0.4 + 0.2 * 3.0, abs=1e-6)


def test_gae_puts_the_outcome_on_the_last_policy_token_and_skips_observations():
    tree = RolloutTree(Segment([1], role="prompt"))
    leaf = tree.add_path([pol([2, 3]), obs([4]), pol([5])])
    tree.set_reward(leaf, 1.0)
    batch = build_batch([tree])
    values = torch.tensor([[0.0, 0.1, 0.2, 0.0, 0.3]])
    cfg = AlgorithmConfig(method="ppo", ppo={"gamma": 1.0, "lam": 1.0})
    out = compute_advantages(cfg, batch, [tree], Signals(values=values))
    adv, ret = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.1, 0.2, 0.3]]), torch.ones(1, 3)
    )
    assert out.advantages[0, [1, 2, 4]].tolist() == pytest.approx(adv[0].tolist())
    assert out.returns[0, [1, 2, 4]].tolist() == pytest.approx(ret[0].tolist())
    assert out.advantages[0, [0, 3]].tolist() == [0.0, 0.0]


def test_critical_routing_and_forked_parent_counts_use_state_nodes():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(pol([2]), 0)
    o = tree.add(obs([3]), a)
    b = tree.add(pol([4]), o)
    c = tree.add(pol([5]), o)
    for leaf, r in ((b, 1.0), (c, 0.0)):
        tree.set_reward(leaf, r)
    tree.info["fork_counts"] = {str(o): 1}  # the engine counts forks at the state after the observation
    batch = build_batch([tree])
    for rule in ("multi_child", "forked_parent"):
        cfg = AlgorithmConfig(method="carl-critical")
        cfg.carl_critical.update_rule = rule
        out = compute_advantages(cfg, batch, [tree], Signals())
        dt, _, policy_node, leaf_rewards = decisions(tree)
        kwargs = {"fork_counts": {1: 1}} if rule == "forked_parent" else {}
        _, adv, update = critical_action_advantages(dt.parents, leaf_rewards, rule=rule, **kwargs)
        trained = {int(n) for n in batch.segment_ids[out.loss_mask].unique()}
        assert trained == {policy_node[i] for i in range(1, len(update)) if update[i]} == {b, c}
        assert float(out.advantages[batch.segment_ids == b][0]) == pytest.approx(adv[2])


def test_portool_routing_matches_the_credit_function():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(pol([2, 2], fmt=0.25), 0)
    o = tree.add(obs([3]), a)
    b = tree.add(pol([4], fmt=0.25), o)
    c = tree.add(pol([5, 5, 5], fmt=-0.25), o)
    d = tree.add(pol([6], fmt=0.25), 0)
    for leaf, r in ((b, 1.0), (c, -1.0), (d, 0.0)):
        tree.set_reward(leaf, r)
    batch = build_batch([tree])
    out = compute_advantages(AlgorithmConfig(method="portool"), batch, [tree], Signals())
    dt, step_of, _, leaf_rewards = decisions(tree)
    direct = portool_advantages(dt.parents, [0, 2, 1, 3, 1], leaf_rewards, [0.0, 0.25, 0.25, -0.25, 0.25])
    for traj in batch.trajectories:
        r = traj.rows[0]
        for node, value in zip(traj.policy_nodes, direct[step_of[traj.leaf]], strict=True):
            assert float(out.advantages[r][batch.segment_ids[r] == node][0]) == pytest.approx(value, abs=1e-6)


def test_gear_reweighting_equals_gear_advantages_for_a_constant_advantage():
    tree = RolloutTree(Segment([1], role="prompt"))
    leaves = [tree.add_path([pol([2, 3, 4]), obs([9]), pol([5, 6])]) for _ in range(2)]
    tree.set_reward(leaves[0], 1.0)
    tree.set_reward(leaves[1], 0.0)
    batch = build_batch([tree])
    g = torch.Generator().manual_seed(0)
    batch.old_logp = torch.where(batch.policy_mask, -torch.rand(batch.input_ids.shape, generator=g), 0.0)
    teacher = torch.where(batch.policy_mask, -torch.rand(batch.input_ids.shape, generator=g), 0.0)
    entropy = torch.where(batch.policy_mask, torch.rand(batch.input_ids.shape, generator=g) + 0.5, 0.0)
    cfg = AlgorithmConfig(method="gear")
    out = compute_advantages(cfg, batch, [tree], Signals(teacher_logp=teacher, entropy=entropy))
    base = compute_advantages(AlgorithmConfig(method="grpo"), batch, [tree], Signals())
    for traj in batch.trajectories:
        r = traj.rows[0]
        mask = batch.policy_mask[r]
        a = float(base.advantages[r][mask][0])
        direct = gear_advantages(  # with the configured normalisation (auto since issue 31: gear.md A3)
            a,
            batch.old_logp[r][mask],
            teacher[r][mask],
            entropy[r][mask],
            torch.ones(int(mask.sum())),
            normalisation=cfg.gear.normalize,
        )
        assert out.advantages[r][mask].tolist() == pytest.approx(direct.tolist(), abs=1e-6)
