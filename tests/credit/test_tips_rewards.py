"""tips: turn rewards (Eqs. 17-20), the potential, per-batch alpha, token placement and the GAE shift."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import (
    gae_advantages,
    tips_batch_alpha,
    tips_potential,
    tips_teacher_refresh_due,
    tips_token_rewards,
    tips_turn_rewards,
)


def test_hand_computed_two_tool_turns():
    rewards = tips_turn_rewards([-3.0, -1.5, -0.5], 1.2, alpha=0.2)
    # 0.2 * 1.5, 0.2 * 1.0, then 1.2 - 0.2 * (-0.5)
    assert rewards == pytest.approx([0.3, 0.2, 1.3], abs=1e-12)
    assert sum(rewards) == pytest.approx(1.2 - 0.2 * -3.0, abs=1e-12)


def test_no_tool_episode_paper_and_code_modes():
    assert tips_turn_rewards([-2.0], 1.0, alpha=0.1) == pytest.approx(
        [1.2]
    )  # paper: outcome - alpha*Phi(S_0)
    assert tips_turn_rewards([-2.0], 1.0, alpha=0.1, no_tool_shaping="none") == [1.0]  # released code
    # the code mode only changes M = 0 episodes
    assert tips_turn_rewards([-2.0, -1.0], 1.0, alpha=0.1, no_tool_shaping="none") == pytest.approx(
        [0.1, 1.1]
    )


def test_hold_terminal_ablation():
    assert tips_turn_rewards([-2.0, -1.0], 1.0, alpha=0.1, terminal_potential="hold") == pytest.approx(
        [0.1, 1.0]
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-30.0, 0.0, allow_nan=False), min_size=1, max_size=6),
    st.sampled_from([0.0, 0.2, 1.0, 1.2]),
    st.floats(0.0, 1.0),
)
def test_rewards_sum_to_outcome_minus_alpha_phi0(potentials, outcome, alpha):
    rewards = tips_turn_rewards(potentials, outcome, alpha=alpha)
    assert len(rewards) == len(potentials)
    assert math.fsum(rewards) == pytest.approx(outcome - alpha * potentials[0], abs=1e-9)


def test_turn_constant_shift_under_gae():
    # Spec Sec. 9.3 test 2: with V = 0 and gamma = lam = 1, shaped minus outcome-only returns equal
    # -alpha * Phi(S_{k-1}) on every policy token of turn k.
    #          turn 1 ...  obs   turn 2 ...  obs   answer
    mask = torch.tensor([1, 1, 1, 0, 0, 1, 1, 0, 1, 1])
    reward_pos = [2, 6, 9]  # last policy token of each assistant message
    turn_of = {0: 1, 1: 1, 2: 1, 5: 2, 6: 2, 8: 3, 9: 3}
    phi, outcome, alpha = [-4.0, -2.5, -0.5], 1.2, 0.3
    shaped = tips_token_rewards(
        tips_turn_rewards(phi, outcome, alpha=alpha), reward_pos, mask, dtype=torch.float64
    )
    plain = tips_token_rewards([0.0, 0.0, outcome], reward_pos, mask, dtype=torch.float64)
    zeros = torch.zeros(1, 10, dtype=torch.float64)
    _, ret_shaped = gae_advantages(shaped.unsqueeze(0), zeros, mask.unsqueeze(0))
    _, ret_plain = gae_advantages(plain.unsqueeze(0), zeros, mask.unsqueeze(0))
    for t, k in turn_of.items():
        assert (ret_shaped - ret_plain)[0, t].item() == pytest.approx(-alpha * phi[k - 1], abs=1e-12)
    assert shaped[mask == 0].tolist() == [0.0, 0.0, 0.0]  # spec Sec. 9.3 test 3


def test_potential_variants():
    one = [[-0.5, -0.25, -1.0]]
    assert tips_potential(one) == pytest.approx(-1.75)  # a single alias: Phi = its sequence log-prob
    assert tips_potential(one, reduce="mean") == pytest.approx(-1.75 / 3)
    two = [[-1.0, -1.0], [-3.0]]
    assert tips_potential(two) == pytest.approx(math.log(math.exp(-2.0) + math.exp(-3.0)), abs=1e-12)
    assert tips_potential(two, aggregate="mean") == pytest.approx(-2.5)
    assert tips_potential(two, aggregate="max") == pytest.approx(-2.0)
    assert tips_potential([torch.tensor([-800.0]), torch.tensor([-800.0])]) == pytest.approx(
        -800.0 + math.log(2)
    )


def test_batch_alpha_hits_target():
    deltas = [0.5, -1.5, 0.0, 2.0, 1e-12]
    alpha = tips_batch_alpha(deltas)
    big = [d for d in deltas if abs(d) > 1e-8]
    assert sum(abs(alpha * d) for d in big) / len(big) == pytest.approx(0.11, abs=1e-12)
    assert tips_batch_alpha(deltas, target_mean_abs=0.2) == pytest.approx(0.2 / (4.0 / 3.0))
    assert tips_batch_alpha([0.0, 1e-10]) is None


def test_token_rewards_placement():
    out = tips_token_rewards([0.5, 1.0], [1, 3], torch.tensor([True, True, False, True]))
    assert out.tolist() == [0.0, 0.5, 0.0, 1.0] and out.dtype == torch.get_default_dtype()
    stacked = tips_token_rewards([0.5, 1.0], [3, 3], torch.tensor([1, 1, 0, 1]), dtype=torch.float64)
    assert stacked.tolist() == [0.0, 0.0, 0.0, 1.5] and stacked.dtype == torch.float64


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: tips_turn_rewards([], 1.0, alpha=0.1), "at least 1"),
        (lambda: tips_turn_rewards([-1.0, float("nan")], 1.0, alpha=0.1), r"potentials\[1\] must be finite"),
        (lambda: tips_turn_rewards([-1.0], float("nan"), alpha=0.1), "outcome must be finite"),
        (lambda: tips_turn_rewards([-1.0], 1.0, alpha=-0.1), "alpha must be >= 0"),
        (lambda: tips_turn_rewards([-1.0], 1.0, alpha=0.1, no_tool_shaping="code"), "no_tool_shaping"),
        (lambda: tips_turn_rewards([-1.0], 1.0, alpha=0.1, terminal_potential="one"), "terminal_potential"),
        (lambda: tips_potential([]), "at least one gold-answer alias"),
        (lambda: tips_potential([[]]), r"answer_logprobs\[0\] needs at least 1"),
        (lambda: tips_potential([[-1.0, 0.5]]), r"answer_logprobs\[0\]\[1\] = 0.5 is not a log-probability"),
        (lambda: tips_potential([[-1.0]], reduce="max"), "reduce must be one of"),
        (lambda: tips_batch_alpha([1.0], target_mean_abs=0.0), "target_mean_abs must be > 0"),
        (lambda: tips_token_rewards([1.0], [2], torch.tensor([1, 1, 0])), "not a policy token"),
        (lambda: tips_token_rewards([1.0], [5], torch.tensor([1, 1, 0])), "not a token index"),
        (lambda: tips_token_rewards([1.0, 2.0], [1], torch.tensor([1, 1, 0])), "positions has 1 entries"),
        (lambda: tips_token_rewards([1.0], [0], torch.tensor([[1, 1]])), "1-D"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_step_alpha_by_hand():
    """One routine for both trainers (issue 14: it was written twice). Deltas 1, 2, -1: mean |dPhi| = 4/3."""
    from agentcredit.credit import tips_step_alpha

    potentials = [[0.0, 1.0, 3.0], [2.0, 1.0]]
    kw = dict(alpha=0.02, target_mean_abs=0.2)
    assert tips_step_alpha(potentials, mode="batch_target", **kw) == pytest.approx(0.15)
    assert tips_step_alpha(potentials, mode="fixed", previous=0.5, **kw) == 0.02
    # no tool turn in the batch: keep the previous batch's alpha, or start from alpha
    assert tips_step_alpha([[1.0], [2.0]], mode="batch_target", previous=0.07, **kw) == 0.07
    assert tips_step_alpha([[1.0], [2.0]], mode="batch_target", **kw) == 0.02
    with pytest.raises(ValueError, match="alpha mode"):
        tips_step_alpha(potentials, mode="adaptive", **kw)


def test_teacher_refresh_schedule_is_the_specs():
    """tips.md §3.10: teacher = theta_200 for steps 201..400, i.e. replaced after updates 200, 400, ..."""
    due = [u for u in range(1, 601) if tips_teacher_refresh_due(u, 200)]
    assert due == [200, 400, 600]
    assert all(tips_teacher_refresh_due(u, 1) for u in range(1, 10))  # N = 1: the current policy
    with pytest.raises(ValueError, match="updates_done and refresh_every must be >= 1"):
        tips_teacher_refresh_due(0, 200)
    with pytest.raises(ValueError, match="updates_done and refresh_every must be >= 1"):
        tips_teacher_refresh_due(5, 0)
