"""The estimator entries on hand-built neutral layouts (agentcredit/credit/estimators.py), hand-worked numbers.

Both trainers reach these entries only through a layout, so the entries are tested on layouts written by hand:
steps spread over rows (carl-segment's replacement mode), shared tree prefixes, and TIPS turn rewards.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import (
    METHODS,
    DecisionTree,
    Episode,
    EpisodeBatch,
    Step,
    chain_trees,
    gear_reweight,
    grpo_advantages,
    tips_step_rewards,
)


def estimate(name, batch, **settings):
    """The estimate of method ``name`` (its own settings' defaults unless given)."""
    method = METHODS[name]
    return method.estimate(batch, method.settings(**settings))


def test_chain_trees_give_each_episode_a_chain_under_its_prompt():
    eps = [
        Episode("a", 1.0, (Step(0, 0, 2), Step(0, 3, 5))),
        Episode("b", 0.0, (Step(1, 0, 2),)),
        Episode("a", 0.0, (Step(2, 0, 1), Step(2, 2, 4))),
    ]
    out, trees = chain_trees(eps)
    assert trees["a"].parents == (-1, 0, 1, 0, 3) and trees["b"].parents == (-1, 0)
    assert [[s.node for s in ep.steps] for ep in out] == [[1, 2], [1], [3, 4]]
    assert out[0].steps[1] == Step(0, 3, 5, node=2)  # spans kept


def test_chain_trees_keep_every_field_of_a_step_and_an_episode():
    """issue 37: chain_trees rebuilt steps by position, so a per-step field a method adds would silently drop on
    the verl path; now only the node changes, whatever fields a Step or an Episode has."""
    import dataclasses

    step = Step(0, 0, 2, anchor=(7, 8), format_reward=0.25, env_reward=0.5)
    ep = Episode("a", 1.0, (step,), turn_ends=())
    [out], _ = chain_trees([ep])
    assert out.steps[0] == dataclasses.replace(step, node=1)
    assert out == dataclasses.replace(ep, steps=(dataclasses.replace(step, node=1),))

    @dataclasses.dataclass(frozen=True)
    class RichStep(Step):  # a field no layout builder knows
        weight: float = 3.0

    [out], _ = chain_trees([Episode("a", 1.0, (RichStep(0, 0, 2),))])
    assert isinstance(out.steps[0], RichStep) and out.steps[0].weight == 3.0


def test_chain_trees_share_the_steps_a_rollout_tree_shares():
    # verl's tree rollouts key each step by (tree, node): two leaves of tree "t" share their first step; an
    # episode without keys stays a chain of its own under the same prompt
    eps = [
        Episode("a", 1.0, (Step(0, 0, 2), Step(0, 3, 5))),
        Episode("a", 0.0, (Step(1, 0, 2), Step(1, 3, 4))),
        Episode("a", 0.0, (Step(2, 0, 1),)),
    ]
    out, trees = chain_trees(eps, [[("t", 1), ("t", 3)], [("t", 1), ("t", 4)], None])
    assert trees["a"].parents == (-1, 0, 1, 1, 0)
    assert [[s.node for s in ep.steps] for ep in out] == [[1, 2], [1, 3], [4]]
    # fork counts keyed by the step before the forked state (None = the prompt), as verl's records carry them
    _, trees = chain_trees(
        eps, [[("t", 1), ("t", 3)], [("t", 1), ("t", 4)], None], {"a": {None: 2, ("t", 1): 1}}
    )
    assert trees["a"].fork_counts == {0: 2, 1: 1}
    with pytest.raises(ValueError, match=r"key \('t', 3\) follows two different steps"):
        chain_trees(eps[:2], [[("t", 1), ("t", 3)], [("t", 2), ("t", 3)]])


def test_tips_step_rewards_put_turn_rewards_on_the_steps_that_end_turns():
    # alpha = 0.5, Phi = (-4, -2, -1), R = 1: turns 0.5 * 2 = 1.0 and 0.5 * 1 = 0.5; final 1 - 0.5 * (-1) = 1.5
    ep = Episode("q", 1.0, (Step(0, 0, 1), Step(0, 2, 3), Step(0, 4, 5)))
    batch = EpisodeBatch((1, 5), [ep], signals={"potentials": [(-4.0, -2.0, -1.0)]})
    assert tips_step_rewards(batch, alpha=0.5) == [[1.0, 0.5, 1.5]]
    # verl names the turn ends; a turn that ends on the last step adds to the final reward there
    ep = Episode("q", 1.0, (Step(0, 0, 1), Step(0, 2, 3)), turn_ends=(1,))
    batch = EpisodeBatch((1, 3), [ep], signals={"potentials": [(-4.0, -2.0)]})
    assert tips_step_rewards(batch, alpha=0.5) == [[0.0, 1.0 + 2.0]]
    with pytest.raises(ValueError, match="episode 0: 2 potentials for 2 tool turns"):
        ep = Episode("q", 1.0, (Step(0, 0, 1), Step(0, 2, 3), Step(0, 4, 5)))
        tips_step_rewards(EpisodeBatch((1, 5), [ep], signals={"potentials": [(-4.0, -2.0)]}), alpha=0.5)


def test_gae_runs_along_an_episode_spread_over_two_rows():
    # replacement mode: step 1 trained in row 0 (cols 1, 2), step 2 in row 1 (cols 2, 3)
    ep = Episode("q", 1.0, (Step(0, 1, 3), Step(1, 2, 4)))
    values = torch.zeros(2, 5)
    values[0, 1:3] = 0.5
    values[1, 2:4] = 0.2
    est = estimate("ppo", EpisodeBatch((2, 5), [ep], signals={"values": values}), gamma=1.0, lam=1.0)
    # gamma = lam = 1: A_t = R - V_t along [0.5, 0.5, 0.2, 0.2]; returns R
    expected = torch.zeros(2, 5)
    expected[0, 1:3] = 0.5
    expected[1, 2:4] = 0.8
    torch.testing.assert_close(est.advantages, expected)
    torch.testing.assert_close(est.returns, (expected != 0).float())
    assert est.loss_mask.sum() == 4 and torch.equal(est.value_mask, est.loss_mask)


def test_critical_on_a_shared_prefix_trains_the_shared_action_once():
    # ep0 and ep1 share their first action (node 1); ep2 is alone under the prompt
    eps = [
        Episode(0, 1.0, (Step(0, 0, 2, node=1), Step(0, 2, 4, node=2))),
        Episode(0, 0.0, (Step(1, 0, 2, node=1), Step(1, 2, 4, node=3))),
        Episode(0, 0.0, (Step(2, 0, 3, node=4),)),
    ]
    batch = EpisodeBatch((3, 4), eps, trees={0: DecisionTree((-1, 0, 1, 1, 0))})
    est = estimate("carl-critical", batch)
    # V(2) = 1, V(3) = 0, V(1) = 0.5, V(4) = 0, V(0) = 0.25: A(1) = 0.25, A(2) = 0.5, A(3) = -0.5, A(4) = -0.25
    expected = torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.25, 0.25, -0.5, -0.5], [-0.25, -0.25, -0.25, 0.0]])
    torch.testing.assert_close(est.advantages, expected)
    loss = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(est.loss_mask, loss)  # node 1 enters the update once, in ep0's row
    assert est.stats == {"critical/actions_rolled": 4.0, "critical/actions_updated": 4.0}


def test_gear_with_alpha_zero_leaves_the_advantage_unchanged():
    ep = Episode("q", 1.0, (Step(0, 0, 3),))
    adv = torch.tensor([[0.7, 0.7, 0.7, 0.0]])
    rand = torch.rand(1, 4)
    batch = EpisodeBatch(
        (1, 4), [ep], signals={"student_logp": -rand, "teacher_logp": -2 * rand, "entropy": rand}
    )
    torch.testing.assert_close(gear_reweight(batch, adv, alpha=0.0), adv)
    with pytest.raises(ValueError, match="gear needs `entropy`"):
        gear_reweight(EpisodeBatch((1, 4), [ep], signals={"student_logp": -rand, "teacher_logp": -rand}), adv)


def test_missing_signals_are_named():
    ep = Episode("q", 1.0, (Step(0, 0, 1),))
    with pytest.raises(ValueError, match="segment needs `values`"):
        estimate("carl-segment", EpisodeBatch((1, 2), [ep]))
    with pytest.raises(ValueError, match="portool needs the decision tree of group 'q'"):
        estimate("portool", EpisodeBatch((1, 2), [ep]))
    with pytest.raises(ValueError, match=r"`values` has shape \(1, 3\), expected \(1, 2\)"):
        estimate("ppo", EpisodeBatch((1, 2), [ep], signals={"values": torch.zeros(1, 3)}))


@st.composite
def layouts(draw):
    """Independent episodes in one row each, 1-3 steps of 1-3 tokens with gaps (observations) between them."""
    n = draw(st.integers(1, 6))
    episodes, width = [], 0
    for row in range(n):
        steps, col = [], 0
        for _ in range(draw(st.integers(1, 3))):
            col += draw(st.integers(0, 2))
            length = draw(st.integers(1, 3))
            steps.append(Step(row, col, col + length, anchor=(draw(st.integers(0, 1)),)))
            col += length
        width = max(width, col + 1)
        reward = draw(st.sampled_from([0.0, 1.0]))
        episodes.append(Episode(draw(st.sampled_from("ab")), reward, tuple(steps)))
    episodes, trees = chain_trees(episodes)
    return EpisodeBatch((n, width), episodes, trees=trees, signals={"values": torch.zeros(n, width)})


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_estimator_writes_only_on_trained_tokens(batch):
    trained = batch.trained_mask()
    for name, method in METHODS.items():
        if method.estimate is None:  # a modifier
            continue
        est = method.estimate(batch, method.settings())
        assert not bool((est.advantages[~trained] != 0).any()), name
        assert not bool((est.loss_mask & ~trained).any()), name


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_grpo_entry_is_grpo_advantages_on_every_step(batch):
    est = estimate("grpo", batch, eps=1e-6, scale=True)
    rewards = torch.tensor([ep.reward for ep in batch.episodes], dtype=torch.float64)
    per_episode = grpo_advantages(rewards, [ep.group for ep in batch.episodes]).tolist()
    for ep, a in zip(batch.episodes, per_episode, strict=True):
        for s in ep.steps:
            assert est.advantages[s.row, s.start : s.end].tolist() == pytest.approx([a] * s.length, abs=1e-6)


def test_an_episode_without_steps_still_counts_in_its_group_and_is_named_where_it_cannot():
    # the agent loop can end an episode whose first generation was empty: no step, but an outcome
    eps = [Episode("q", 1.0, (Step(0, 0, 2),)), Episode("q", 0.0, ())]
    batch = EpisodeBatch((2, 3), eps, signals={"values": torch.zeros(2, 3)})
    est = estimate("grpo", batch, eps=1e-6, scale=False)
    assert est.advantages[0, :2].tolist() == [0.5, 0.5]  # R - mean(1, 0): the empty episode is in the mean
    assert batch.token_index()[1][0].numel() == 0
    with pytest.raises(ValueError, match=r"episode 1 \(group 'q'\) has no policy step; gae needs one"):
        estimate("ppo", batch)
    with pytest.raises(
        ValueError, match=r"episode 1 \(group 'q'\) has no policy step; carl-critical needs one"
    ):
        estimate("carl-critical", EpisodeBatch((2, 3), *chain_trees(eps)))


def test_bad_layouts_and_non_finite_signals_name_the_batch_position():
    with pytest.raises(
        ValueError, match=r"episode 0 \(group 'q'\) step 1: row 0, tokens \[3, 9\) lie outside"
    ):
        EpisodeBatch((1, 5), [Episode("q", 1.0, (Step(0, 0, 1), Step(0, 3, 9)))])
    values = torch.zeros(2, 5)
    values[1, 3] = float("nan")
    batch = EpisodeBatch((2, 5), [Episode("q", 1.0, (Step(0, 0, 2),)), Episode("q", 0.0, (Step(1, 2, 4),))])
    batch.signals["values"] = values
    with pytest.raises(ValueError, match=r"values\[\(1, 3\)\] = nan"):
        estimate("ppo", batch)
