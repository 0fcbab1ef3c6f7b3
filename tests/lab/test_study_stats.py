"""The statistics of ``agentcredit study`` reports: t intervals, Welch intervals and claim verdicts, by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcredit.lab.power import seeds_needed, t975
from agentcredit.lab.study_report import (
    absolute_deviations,
    decide_note,
    mean_interval,
    paired_interval,
    paired_sd,
    planning_sd_cell,
    power_level,
    seeds_needed_cell,
    seeds_to_decide,
    start_seconds,
    verdict,
    verdict_label,
    welch_interval,
)


def test_t_quantiles_are_the_published_ones():
    """scipy's exact quantile (issue 49 replaced the hand-kept table and its linear interpolation)."""
    assert t975(1) == pytest.approx(12.706, abs=1e-3) and t975(2) == pytest.approx(4.303, abs=1e-3)
    assert t975(30) == pytest.approx(2.042, abs=1e-3) and t975(1e9) == pytest.approx(1.960, abs=1e-3)
    assert 3.182 < t975(2.5) < 4.303  # fractional Welch df: between its neighbours (exact: 3.5747)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_mean_interval_by_hand():
    # mean 2, s = 1, n = 3: half width = t_{0.975, 2} / sqrt(3) = 4.302653 / 1.732051 = 2.48414
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert low == pytest.approx(2.0 - 2.48414, abs=1e-5) and high == pytest.approx(2.0 + 2.48414, abs=1e-5)
    assert mean_interval([0.7]) == (0.7, 0.7, 0.7)  # one seed: no interval
    with pytest.raises(ValueError):
        mean_interval([])


def test_welch_interval_by_hand():
    # a = 1,2,3 (mean 2, var 1), b = 2,4,6 (mean 4, var 4); se^2 = 1/3 + 4/3 = 5/3
    # df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 2.94118 -> t_{0.975, 2.94118} = 3.21876 (exact)
    # half = 3.21876 * sqrt(5/3) = 4.15540
    diff, low, high = welch_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert diff == pytest.approx(-2.0)
    assert low == pytest.approx(-2.0 - 4.15540, abs=1e-4) and high == pytest.approx(-2.0 + 4.15540, abs=1e-4)
    assert welch_interval([1.0], [2.0, 3.0]) is None
    assert welch_interval([1.0, 1.0], [0.0, 0.0]) == (1.0, 1.0, 1.0)  # no spread on either side


@pytest.mark.parametrize(
    ("direction", "interval", "margin", "expected"),
    [
        ("lower", (-0.3, -0.5, -0.1), 0.0, "reproduced"),
        ("lower", (0.3, 0.1, 0.5), 0.0, "not reproduced"),
        ("lower", (-0.1, -0.4, 0.2), 0.0, "underpowered"),
        ("higher", (0.3, 0.1, 0.5), 0.0, "reproduced"),
        ("higher", (-0.3, -0.5, -0.1), 0.0, "not reproduced"),
        ("not_lower", (-0.01, -0.04, 0.02), 0.05, "reproduced"),
        ("not_lower", (-0.05, -0.09, 0.02), 0.05, "underpowered"),
        ("not_lower", (-0.2, -0.3, -0.1), 0.05, "not reproduced"),
        ("not_lower", (-0.03, -0.08, -0.01), 0.05, "underpowered"),  # below 0 but within the margin
        ("not_higher", (0.01, -0.02, 0.04), 0.05, "reproduced"),
        ("not_higher", (0.2, 0.1, 0.3), 0.05, "not reproduced"),
        ("lower", None, 0.0, "underpowered"),
        # both arms identical on every seed (e.g. tool rate 1.0 everywhere): the arm is not lower, not "maybe"
        ("lower", (0.0, 0.0, 0.0), 0.0, "not reproduced"),
        ("higher", (0.0, 0.0, 0.0), 0.0, "not reproduced"),
        ("lower", (0.0, -0.01, 0.01), 0.0, "underpowered"),
    ],
)
def test_verdicts(direction, interval, margin, expected):
    assert verdict(direction, interval, margin) == expected


@pytest.mark.parametrize(
    ("direction", "interval", "equivalence", "expected"),
    [
        # a true zero measured well: [-0.1, 0.2] reaches 0 but rules out an effect of 0.5 or more
        ("higher", (0.05, -0.1, 0.2), 0.5, "effect excluded"),
        ("lower", (-0.05, -0.2, 0.1), 0.5, "effect excluded"),
        # the same interval against a margin it does not clear
        ("higher", (0.05, -0.1, 0.2), 0.15, "underpowered"),
        ("lower", (-0.05, -0.2, 0.1), 0.15, "underpowered"),
        # without a margin stated before the runs, no verdict can say "effect excluded"
        ("higher", (0.05, -0.1, 0.2), None, "underpowered"),
        # the claimed side or the opposite sign still wins over the margin
        ("higher", (0.3, 0.1, 0.4), 0.5, "reproduced"),
        ("lower", (0.3, 0.1, 0.4), 0.5, "not reproduced"),
    ],
)
def test_a_verdict_can_exclude_the_effect(direction, interval, equivalence, expected):
    """Regression (issue 49): a "lower" claim with a true zero always read "inconclusive"; an interval that rules out
    the stated equivalence margin now says the effect is excluded."""
    assert verdict(direction, interval, 0.0, equivalence) == expected


def test_intervals_at_the_claims_level_and_the_seeds_that_would_decide():
    """Bonferroni: a study of five claims reads each interval at 99%; an underpowered claim says how many seeds
    would decide at the spread it saw."""
    diffs = [0.1, 0.3, 0.2]  # mean 0.2, sd 0.1, 3 seeds
    _, low95, high95 = mean_interval(diffs)
    _, low99, high99 = mean_interval(diffs, 0.01)
    assert high95 - low95 == pytest.approx(2 * 4.303 * 0.1 / math.sqrt(3), abs=1e-3)
    assert high99 - low99 == pytest.approx(2 * 9.925 * 0.1 / math.sqrt(3), abs=1e-3)  # t_{0.995, 2} = 9.925
    a = {0: 0.1, 1: 0.3, 2: 0.2}
    b = {0: 0.0, 1: 0.0, 2: 0.0}
    assert paired_interval(a, b, 0.01) == pytest.approx((0.2, low99, high99))
    assert paired_sd(a, b) == pytest.approx(0.1)
    n = seeds_to_decide("higher", a, b, 0.05, 0.05)
    assert n == seeds_needed(0.05, 0.0, 1, paired_sd=0.1) and n > 3
    assert seeds_to_decide("higher", {0: 1.0}, {0: 0.0}, 0.05, 0.05) is None


finite = st.floats(min_value=-10, max_value=10, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=12))
def test_mean_interval_contains_the_mean_and_is_symmetric(values):
    mean, low, high = mean_interval(values)
    assert low <= mean + 1e-12 and mean <= high + 1e-12
    assert math.isclose(mean - low, high - mean, rel_tol=1e-9, abs_tol=1e-9)


@given(st.lists(finite, min_size=2, max_size=8), st.lists(finite, min_size=2, max_size=8), finite)
def test_welch_interval_shifts_with_the_data(a, b, shift):
    d1, lo1, hi1 = welch_interval(a, b)
    d2, lo2, hi2 = welch_interval([x + shift for x in a], b)
    assert d2 == pytest.approx(d1 + shift, abs=1e-9)
    assert hi2 - lo2 == pytest.approx(hi1 - lo1, rel=1e-6, abs=1e-9)  # the width depends on the spread only


def test_lower_spread_is_levene_on_absolute_deviations_by_hand():
    # arm 0.5, 0.5, 0.5 (no spread); baseline 0.2, 0.5, 0.8 (mean 0.5): deviations 0, 0, 0 vs 0.3, 0, 0.3
    assert absolute_deviations([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert absolute_deviations([0.2, 0.5, 0.8]) == pytest.approx([0.3, 0.0, 0.3])
    # Welch on the deviations: diff -0.2, se = sqrt(0.03 / 3) = 0.1, df = 2 (only the baseline varies)
    diff, low, high = welch_interval([0.0, 0.0, 0.0], [0.3, 0.0, 0.3])
    assert diff == pytest.approx(-0.2) and high == pytest.approx(-0.2 + 4.302653 * 0.1)
    assert verdict("lower_spread", (diff, low, high)) == "underpowered"  # 3 seeds cannot show it here
    assert verdict("lower_spread", (-0.2, -0.3, -0.1)) == "reproduced"
    assert verdict("lower_spread", (0.1, 0.0, 0.2)) == "not reproduced"


def test_paired_interval_by_hand_decides_where_welch_cannot():
    """Issue 32: arms share each seed's questions and order, so the seed's luck moves both alike. Pairing by
    seed removes it: diffs 0.05, 0.05, 0.04 -> mean 0.04667, s = 0.005774, half = 4.303 * s / sqrt(3) = 0.01434.
    Welch on the same numbers sees seed-to-seed spreads of 0.2 and calls it inconclusive."""
    arm = {0: 0.30, 1: 0.50, 2: 0.70}
    base = {0: 0.25, 1: 0.45, 2: 0.66}
    diff, low, high = paired_interval(arm, base)
    assert diff == pytest.approx(0.046667, abs=1e-6)
    assert (low, high) == (
        pytest.approx(0.046667 - 0.014344, abs=1e-5),
        pytest.approx(0.046667 + 0.014344, abs=1e-5),
    )
    assert verdict("higher", (diff, low, high)) == "reproduced"
    assert verdict("higher", welch_interval(list(arm.values()), list(base.values()))) == "underpowered"


def test_paired_interval_uses_only_seeds_both_arms_finished():
    # seeds 0 and 1: diffs 0.5 and 1.0, mean 0.75, s = 0.353553, half = 12.706 * s / sqrt(2) = 3.1765
    assert paired_interval({0: 1.0, 1: 2.0, 2: 9.0}, {0: 0.5, 1: 1.0}) == pytest.approx(
        (0.75, -2.4265, 3.9265), abs=1e-4
    )
    assert paired_interval({0: 1.0, 1: 2.0}, {1: 1.0, 2: 0.0}) is None  # one shared seed: no interval


def test_a_claim_whose_arms_never_ran_reads_not_run_not_underpowered():
    """No finished seed of either arm: no interval was measured, so the cell says NOT RUN (issue 49: a regime
    that is not met stops the arms, and 'underpowered' would read as if more seeds of this plan would decide)."""
    plan = {"mde": 0.669, "effect": 0.489}
    assert verdict("lower", None) == "underpowered"  # the rule itself is unchanged
    assert verdict_label("underpowered", ran=False, regime_met=True) == "NOT RUN"
    assert (
        verdict_label("underpowered", ran=False, regime_met=False, plan=plan)
        == "NOT RUN (regime not met) (the plan is underpowered: MDE 0.669 > 0.489)"
    )
    # arms that ran keep their verdict, stamped when their regime was not met
    assert verdict_label("reproduced", ran=True, regime_met=False) == "REPRODUCED (regime not met)"
    assert (
        verdict_label("underpowered", ran=True, regime_met=True, plan=plan)
        == "UNDERPOWERED (underpowered: MDE 0.669 > 0.489)"
    )


def test_the_power_table_names_the_level_each_claim_was_planned_at():
    """Five claims under Bonferroni at a family-wise 0.05 are planned at 0.01 each, and the table's heading says so
    (it used to say alpha 0.05 whatever the record held)."""
    spec = SimpleNamespace(alpha=0.05, multiplicity="bonferroni", claims=[object()] * 5)
    assert power_level(spec, [{"alpha": 0.01}] * 5) == (
        "alpha 0.01 per claim: bonferroni over 5 claims at family-wise 0.05"
    )
    # a record planned before the control, or one claim: the study's alpha itself
    assert power_level(spec, [{"alpha": 0.05}]) == "alpha 0.05 per claim"
    assert (
        power_level(SimpleNamespace(alpha=0.05, multiplicity="none", claims=[1, 2]), [])
        == "alpha 0.05 per claim"
    )


def test_the_start_costs_what_its_parts_recorded(tmp_path):
    """A start resumed across processes: its summary's own seconds timed only the last process (2,396.7 s of the
    warm-up there), the report adds what each part recorded: SFT 1,236.2 + warm-up 2,393.6 + held-out 257.4 s."""
    (tmp_path / "heldout_start.json").write_text('{"eval_seconds": 257.4}')
    summary = {"sft": {"seconds": 1236.2}, "warmup": {"seconds": 2393.6}, "seconds": 2396.7}
    assert start_seconds(summary, tmp_path) == pytest.approx(1236.2 + 2393.6 + 257.4)
    assert start_seconds({"sft": {"seconds": 5064.0}, "seconds": 1.0}, tmp_path) == pytest.approx(
        5064.0 + 257.4
    )
    assert start_seconds({"seconds": 12.0}, tmp_path / "missing") == 12.0


def test_the_power_table_says_what_each_plan_rests_on():
    """A pilot's paired SD is shown with its seeds and the seeds range over its 95% interval (issue 49); a seed SD
    is a point plan with the question noise added."""
    pilot = {"paired_sd": 0.54, "pilot_seeds": 3, "seeds_needed": 6, "seeds_range": [4, 6, None]}
    assert planning_sd_cell(pilot, "first round") == "paired 0.540 (from 3 seeds); first round"
    assert seeds_needed_cell(pilot) == "6 (range 4 to > 100 over the SD's 95% interval)"
    point = {"paired_sd": None, "seed_sd": 0.0, "seeds_needed": None, "underpowered": True}
    assert planning_sd_cell(point) == "seed 0.000 + question noise (point plan)"
    assert seeds_needed_cell(point) == "> 100"
    # a seed SD of 0 (a degenerate first round) counts the question noise alone: the count is a floor
    assert (
        seeds_needed_cell({**point, "seeds_needed": 4})
        == ">= 4 (question noise alone: the seed spread is unknown)"
    )
    assert seeds_needed_cell({**point, "seed_sd": 0.1, "seeds_needed": 9}) == "9 (point plan)"


def test_a_spread_claim_is_read_at_the_claims_level():
    """lower_spread verdicts use the Welch interval at the study's per-claim alpha (Bonferroni), not always at 95%:
    by hand, a = [1, 2, 3], b = [2, 4, 6]: diff -2, se^2 = 1/3 + 4/3 = 5/3, Welch df = (5/3)^2 / ((1/3)^2/2 +
    (4/3)^2/2) = 2.941; at alpha 0.01 the half-width is t(0.995, 2.941) x sqrt(5/3)."""
    from scipy import stats as st_

    df = (5 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2)
    assert df == pytest.approx(2.941, abs=1e-3)
    diff, low, high = welch_interval([1, 2, 3], [2, 4, 6], alpha=0.01)
    half = st_.t.ppf(0.995, df) * math.sqrt(5 / 3)
    assert (diff, low, high) == pytest.approx((-2.0, -2.0 - half, -2.0 + half))
    assert welch_interval([1, 2, 3], [2, 4, 6])[1] > low  # the 95% interval is narrower


def test_an_underpowered_claim_after_its_runs_says_what_would_decide_it():
    """The seeds at the observed spread, their range over the spread's 95% interval, and both arms' hours at that
    count: 5 seeds x (2.0 + 1.5) h = 17.5 h."""
    assert decide_note(5, (4, 5, None), 2.0, 1.5) == (
        "5 seeds would decide at this spread, range 4 to > 100 over its 95% interval; about 17.5 CPU hours for the "
        "two arms"
    )
    assert decide_note(7, None, None, None) == "7 seeds would decide at this spread"
