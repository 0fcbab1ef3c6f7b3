"""Power before spending: the paired MDE, the seeds it asks for and the planned budget, by hand-worked numbers,
against the normal closed form and a simulation of the study's own paired t interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.lab.power import (
    claim_alpha,
    paired_mde,
    paired_power,
    per_seed_sd,
    planned_seconds,
    question_sd,
    runs_evaluations,
    sd_interval,
    seeds_needed,
    seeds_range,
    t975,
)
from agentcredit.lab.study_report import mean_interval

Z80, Z975 = 0.841621, 1.959964  # the normal quantiles at 0.80 and 0.975


def test_t975_is_the_published_quantile():
    assert t975(1) == pytest.approx(12.706, abs=1e-3) and t975(2) == pytest.approx(4.303, abs=1e-3)
    assert t975(30) == pytest.approx(2.042, abs=1e-3) and t975(1e9) == pytest.approx(Z975, abs=1e-5)
    with pytest.raises(ValueError):
        t975(0)


def test_question_sd_of_a_binary_metric():
    # p = 1/4 over 4 questions: sqrt(p (1 - p) n / (n - 1)) = sqrt(0.1875 * 4 / 3) = 0.5
    assert question_sd([1, 0, 0, 0]) == pytest.approx(0.5)
    assert question_sd([1.0]) == 0.0


def test_paired_mde_is_the_exact_noncentral_t_one():
    """Regression (issue 49): the shifted-central-t shortcut gave 1.68 tool calls for the PORTool study's plan
    (150 questions, sd 0.4568, seed SD 0.54, 3 seeds); the exact noncentral t gives 1.77 (5.653 SE, not 5.364)."""
    se = math.sqrt((2 * 0.45681515899262587**2 / 150 + 0.54**2) / 3)
    mde = paired_mde(0.45681515899262587, 150, 3, seed_sd=0.54)
    assert mde == pytest.approx(1.771, abs=1e-3)
    assert mde / se == pytest.approx(5.653, abs=1e-3)
    assert paired_power(mde, se, 2) == pytest.approx(0.8, abs=1e-9)
    # the one non-degenerate pair of the first round (GiGPO - GRPO): paired SD 0.135 -> MDE 0.44 at 3 seeds
    assert paired_mde(0.0, 1, 3, paired_sd=0.135) == pytest.approx(0.4406, abs=1e-3)


def test_a_pilots_paired_sd_is_not_added_to_the_question_noise_again():
    """Regression (issue 49): an SD of d_s measured over a pilot's seeds already holds the question noise."""
    assert per_seed_sd(0.5, 100, paired_sd=0.2) == 0.2
    assert per_seed_sd(0.5, 100, seed_sd=0.1) == pytest.approx(math.sqrt(2 * 0.25 / 100 + 0.01))
    assert per_seed_sd(0.5, 100, rho=0.5) == pytest.approx(math.sqrt(0.0025))
    assert paired_mde(0.5, 100, 4, paired_sd=0.2) == paired_mde(0.9, 7, 4, seed_sd=3.0, paired_sd=0.2)


def test_sd_interval_by_hand_and_the_seeds_range_it_gives():
    # df 2: chi2 is exponential with mean 2, quantile -2 ln(1 - p): 7.3778 at 0.975, 0.050636 at 0.025
    low, high = sd_interval(1.0, 2)
    assert low == pytest.approx(math.sqrt(2 / (-2 * math.log(0.025))), rel=1e-6)  # 0.5207
    assert high == pytest.approx(math.sqrt(2 / (-2 * math.log(0.975))), rel=1e-6)  # 6.2847
    few, point, many = seeds_range(0.55, 0.135, 2)
    assert few == 3 and point == 3 and many == seeds_needed(0.55, 0.0, 1, paired_sd=0.135 * high)
    assert few <= point <= many


def test_claim_alpha_under_bonferroni():
    assert claim_alpha(0.05, 5) == pytest.approx(0.01) and claim_alpha(0.05, 1) == 0.05
    assert claim_alpha(0.05, 5, "none") == 0.05
    with pytest.raises(ValueError, match="holm-ish"):
        claim_alpha(0.05, 3, "holm-ish")
    # a stricter level asks for a larger effect
    assert paired_mde(0.5, 100, 5, alpha=0.01) > paired_mde(0.5, 100, 5)


def test_paired_mde_meets_the_normal_closed_form_at_many_seeds():
    s, n, seeds = 0.4, 150, 100_000
    closed = (Z975 + Z80) * math.sqrt(2 * s**2 / n / seeds)  # 2.8016 * SE
    assert paired_mde(s, n, seeds) == pytest.approx(closed, rel=1e-3)


def test_paired_mde_refuses_what_has_no_interval():
    with pytest.raises(ValueError, match="seeds"):
        paired_mde(0.5, 100, 1)
    with pytest.raises(ValueError):
        paired_mde(0.5, 0, 3)
    with pytest.raises(ValueError):
        paired_mde(0.5, 10, 3, rho=1.5)


def test_seeds_needed():
    # sd 0.5, 100 questions: SE = sqrt(0.005 / S); 3 seeds: 5.653 x 0.0408 = 0.231 > 0.2; 4 seeds: 0.163 <= 0.2
    assert paired_mde(0.5, 100, 3) > 0.2 >= paired_mde(0.5, 100, 4)
    assert seeds_needed(0.2, 0.5, 100) == 4
    assert seeds_needed(-0.2, 0.5, 100) == 4  # the sign of a "lower" effect does not matter
    assert seeds_needed(0.5, 0.5, 100) == 3  # the studies' floor
    assert seeds_needed(0.01, 0.5, 10, seed_sd=1.0) is None


def test_evaluations_and_the_planned_budget_by_hand():
    assert runs_evaluations(60, 10) == 6 and runs_evaluations(15, 5) == 3
    assert runs_evaluations(10, 3) == 4 and runs_evaluations(5, 0) == 1
    # a: 3 x (60 x 10 + 6 x 100) = 3,600 s; b: 3 x (60 x 20 + 600) = 5,400 s
    assert planned_seconds({"a": 10.0, "b": 20.0}, 3, 60, 100.0, 10) == {
        "a": 3600.0,
        "b": 5400.0,
        "total": 9000.0,
    }


@settings(max_examples=60, deadline=None)
@given(
    sd=st.floats(0.01, 3.0),
    n=st.integers(1, 500),
    seeds=st.integers(2, 40),
    seed_sd=st.floats(0.0, 1.0),
    k=st.floats(0.1, 10.0),
)
def test_paired_mde_scales_and_falls_with_data(sd, n, seeds, seed_sd, k):
    base = paired_mde(sd, n, seeds, seed_sd=seed_sd)
    assert paired_mde(k * sd, n, seeds, seed_sd=k * seed_sd) == pytest.approx(k * base, rel=1e-9)
    assert paired_mde(sd, n + 1, seeds, seed_sd=seed_sd) <= base
    assert paired_mde(sd, n, seeds + 1, seed_sd=seed_sd) < base


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_a_true_effect_at_the_mde_is_found_about_80_percent_of_the_time(seeds):
    """Simulate the study: per seed the paired difference is MDE + noise of the planned variance, and the study's
    own paired 95% t interval (mean_interval) must lie above 0 in 80% of the studies (exact noncentral t)."""
    rng = np.random.default_rng(seeds)
    sd, n, seed_sd = 0.45, 150, 0.05
    mde = paired_mde(sd, n, seeds, seed_sd=seed_sd)
    per_seed_sd = math.sqrt(2 * sd**2 / n + seed_sd**2)
    trials = 4000
    found = sum(
        mean_interval(list(mde + per_seed_sd * rng.standard_normal(seeds)))[1] > 0 for _ in range(trials)
    )
    assert 0.78 <= found / trials <= 0.82  # 4,000 trials: 3 SE = 0.019


def test_each_arm_is_priced_at_the_seeds_its_own_claims_need():
    """kb-jsoncall-portool-regime's shape: PORTool vs GRPO needs 48 seeds (accuracy), PORTool vs GiGPO 7; the
    variant arm is in no claim. By hand, at 3 planned seeds with 10 / 20 / 30 / 40 s per arm: grpo 48 x 10 / 3 =
    160, portool 48 x 30 / 3 = 480, gigpo 7 x 20 / 3 = 46.67, the variant 0: 686.67 s (every arm at 48: 1,600 s)."""
    from agentcredit.lab.power import arm_seeds_to_decide, seconds_to_decide

    claims = [
        ("portool", "grpo", 6),
        ("portool", "grpo", 48),
        ("portool", "gigpo", 7),
        ("portool", "grpo", None),
    ]
    arm_seeds = arm_seeds_to_decide(claims)
    assert arm_seeds == {"portool": 48, "grpo": 48, "gigpo": 7}
    plan = {"grpo": 10.0, "gigpo": 20.0, "portool": 30.0, "variant": 40.0, "total": 100.0}
    assert seconds_to_decide(plan, 3, arm_seeds) == pytest.approx(160 + 480 + 140 / 3)
    assert arm_seeds_to_decide([("a", "b", None)]) == {}
