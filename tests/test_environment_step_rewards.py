"""An environment's step rewards in the neutral layout (``Step.env_reward``; issue 15), hand-worked numbers.

The episode's reward is its return: outcome + the step rewards. Each method reads them in one place
(agentcredit/credit/estimators.py): GAE and carl-segment on their steps, TIPS beside its turn rewards, PORTool
in R_fm(v) with the outcome alone in its outcome terms.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import METHODS, DecisionTree, Episode, EpisodeBatch, Step, tips_step_rewards


def estimate(name, batch, **settings):
    """The estimate of method ``name`` (its own settings' defaults unless given)."""
    method = METHODS[name]
    return method.estimate(batch, method.settings(**settings))


def test_each_step_reward_is_on_its_step_and_the_outcome_on_the_last():
    # outcome 1.0, step rewards 0.5 and 0.25: the episode's reward is 1.75
    ep = Episode("q", 1.75, (Step(0, 0, 1, env_reward=0.5), Step(0, 2, 3, env_reward=0.25), Step(0, 4, 5)))
    assert EpisodeBatch((1, 5), [ep]).rewards_per_step() == [[0.5, 0.25, 1.0]]


def test_gae_sees_the_reward_where_the_environment_paid_it():
    ep = Episode("q", 1.5, (Step(0, 0, 2, env_reward=0.5), Step(0, 3, 5)))
    est = estimate(
        "ppo", EpisodeBatch((1, 5), [ep], signals={"values": torch.zeros(1, 5)}), gamma=1.0, lam=1.0
    )
    # V = 0, gamma = lam = 1: each token's advantage is the reward still to come: 1.5 on step 1, 1.0 on step 2
    torch.testing.assert_close(est.advantages, torch.tensor([[1.5, 1.5, 0.0, 1.0, 1.0]]))


def test_carl_segment_targets_the_reward_still_to_come_at_each_boundary():
    ep = Episode("q", 1.5, (Step(0, 0, 2, env_reward=0.5), Step(0, 3, 5)))
    est = estimate(
        "carl-segment", EpisodeBatch((1, 5), [ep], signals={"values": torch.zeros(1, 5)}), lam=1.0, gamma=1.0
    )
    # Monte-Carlo targets at the boundaries (columns 0 and 3): 1.5 then 1.0; lam = 1, V = 0: A = returns
    assert est.returns[0, 0] == 1.5 and est.returns[0, 3] == 1.0
    torch.testing.assert_close(est.advantages, torch.tensor([[1.5, 1.5, 0.0, 1.0, 1.0]]))


def test_tips_adds_its_turn_rewards_to_the_environments():
    # alpha 0.5, Phi = (-4, -2): turn 1's reward 1.0, plus the environment's 0.5 on that step; the outcome is
    # 1.5 - 0.5 = 1.0, minus alpha * Phi(S_1) = -1: 2.0 on the last step
    ep = Episode("q", 1.5, (Step(0, 0, 1, env_reward=0.5), Step(0, 2, 3)))
    assert tips_step_rewards(
        EpisodeBatch((1, 3), [ep], signals={"potentials": [(-4.0, -2.0)]}), alpha=0.5
    ) == [[1.5, 2.0]]


rewards = st.floats(-2, 2, allow_nan=False).map(lambda x: round(x, 3))


@settings(max_examples=60, deadline=None)
@given(outcomes=st.lists(rewards, min_size=2, max_size=2), env=st.lists(rewards, min_size=4, max_size=4),
       fmt=st.lists(rewards, min_size=4, max_size=4))  # fmt: skip
def test_portool_reads_a_step_reward_as_part_of_r_fm_and_the_outcome_alone(outcomes, env, fmt):
    # two episodes of two steps under one prompt: PORTool's advantages with the environment's step rewards are
    # those of the same tree with the rewards moved into R_fm and left out of the leaves' outcomes
    tree = {0: DecisionTree((-1, 0, 1, 0, 3))}
    nodes = [(1, 2), (3, 4)]

    def batch(with_env: bool) -> EpisodeBatch:
        eps = []
        for j, (o, (a, b)) in enumerate(zip(outcomes, nodes, strict=True)):
            e = (env[2 * j], env[2 * j + 1]) if with_env else (0.0, 0.0)
            f = (
                (fmt[2 * j], fmt[2 * j + 1])
                if with_env
                else (fmt[2 * j] + env[2 * j], fmt[2 * j + 1] + env[2 * j + 1])
            )
            steps = (
                Step(j, 0, 2, a, format_reward=f[0], env_reward=e[0]),
                Step(j, 2, 4, b, format_reward=f[1], env_reward=e[1]),
            )
            eps.append(Episode(0, o + sum(e), steps))
        return EpisodeBatch((2, 4), eps, trees=tree)

    with_env = estimate("portool", batch(True))
    moved = estimate("portool", batch(False))
    torch.testing.assert_close(with_env.advantages, moved.advantages, atol=1e-5, rtol=1e-5)
