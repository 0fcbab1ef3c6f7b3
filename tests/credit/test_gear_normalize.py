"""GEAR's per-trajectory normalisation (minmax | clamp_max | auto) and the statistics that show it going flat
(issue 31, GEAR 2; spec gear.md A3 and §12.4).

The paper says only "we normalize rKL_t to [0, 1] within each trajectory" (GEAR §4.1, seed line 95). With min-max, a
strongly negative minimum (a teacher far surer of the answer tokens than the student) lifts every rKL ~ 0 token
above lambda_KL = 0.1: nearly every token triggers and W is one constant per episode. Spec A3 asks for the trigger
rate to be logged and for clamp_max above a 20% trigger rate: ``normalisation="auto"``. Hand-worked numbers below.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.config import ConfigError, load_config
from agentcredit.credit import Episode, EpisodeBatch, Step, gear_details, gear_reweight_stats
from agentcredit.credit.methods.gear.maths import AUTO_MAX_TRIGGER_RATE

# a negative minimum: the teacher is far surer of token 0 than the student
FLAT = [-4.0, 0.0, 0.5, 0.0, 1.0]
# one sparse spike, the minimum 0: min-max and clamp_max agree
SPARSE = [0.0, 0.05, 1.0, 0.02, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0]


def details(rkl, normalisation, advantage=1.0, segmentation="none"):
    rkl = torch.tensor(rkl, dtype=torch.float64)
    n = rkl.numel()
    return gear_details(
        advantage,
        rkl,  # student log-probs = rKL, teacher = 0
        torch.zeros(n, dtype=torch.float64),
        torch.ones(n, dtype=torch.float64),
        torch.ones(n, dtype=torch.bool),
        normalisation=normalisation,
        segmentation=segmentation,
    )


def test_minmax_by_hand():
    # (rKL + 4) / 5 = [0, .8, .9, .8, 1]: four of five tokens exceed 0.1
    d = details(FLAT, "minmax")
    torch.testing.assert_close(d.rkl_norm, torch.tensor([0.0, 0.8, 0.9, 0.8, 1.0], dtype=torch.float64))
    assert d.trigger_rate == pytest.approx(0.8) and d.normalisation == "minmax"
    # A = +1, alpha = 0.2: W = 1.1 - 0.2 w; the consistent tokens 1 and 3 get 0.94, barely above the spike's 0.9
    torch.testing.assert_close(d.weights, torch.tensor([1.1, 0.94, 0.92, 0.94, 0.9], dtype=torch.float64))


def test_clamp_max_by_hand():
    # max(rKL, 0) / max(max(rKL, 0)) = [0, 0, .5, 0, 1]: two of five tokens exceed 0.1
    d = details(FLAT, "clamp_max")
    torch.testing.assert_close(d.rkl_norm, torch.tensor([0.0, 0.0, 0.5, 0.0, 1.0], dtype=torch.float64))
    assert d.trigger_rate == pytest.approx(0.4) and d.normalisation == "clamp_max"
    torch.testing.assert_close(d.weights, torch.tensor([1.1, 1.1, 1.0, 1.1, 0.9], dtype=torch.float64))
    # no positive rKL at all: r = 0 everywhere (W = 1 + 0.5 alpha sign(A)), not a division by zero
    d = details([-1.0, -2.0, 0.0], "clamp_max", advantage=-1.0)
    torch.testing.assert_close(d.rkl_norm, torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(d.weights, torch.full((3,), 0.9, dtype=torch.float64))


def test_auto_switches_to_clamp_max_above_twenty_percent():
    assert AUTO_MAX_TRIGGER_RATE == 0.2  # spec gear.md A3: "(e.g. > 20%), switch to clamp_max"
    flat = details(FLAT, "auto")  # min-max would trigger on 80% of the tokens
    assert flat.normalisation == "clamp_max"
    torch.testing.assert_close(flat.rkl_norm, details(FLAT, "clamp_max").rkl_norm)
    sparse = details(SPARSE, "auto")  # min-max triggers on 1 of 10 tokens: kept
    assert sparse.normalisation == "minmax" and sparse.trigger_rate == pytest.approx(0.1)
    torch.testing.assert_close(sparse.rkl_norm, details(SPARSE, "minmax").rkl_norm)
    # exactly 20% is not above 20%: min-max stays; 30% switches
    two = [0.0, 1.0, 0.5] + [0.0] * 7
    assert details(two, "auto").normalisation == "minmax"
    assert details([0.0, 1.0, 0.5, 0.4] + [0.0] * 6, "auto").normalisation == "clamp_max"


def test_step_statistics_by_hand():
    # episode 0 (row 0, 5 tokens, A = +1): FLAT; episode 1 (row 1, 10 tokens, A = -1): SPARSE. Entropy is constant,
    # so no token ends a segment (H > 1.5 H_start never holds): a segment runs from its onset to the last token.
    student = torch.zeros(2, 10)
    student[0, :5] = torch.tensor(FLAT)
    student[1] = torch.tensor(SPARSE)
    eps = [Episode("a", 1.0, (Step(0, 0, 5),)), Episode("b", 0.0, (Step(1, 0, 10),))]
    batch = EpisodeBatch(
        (2, 10),
        eps,
        signals={"student_logp": student, "teacher_logp": torch.zeros(2, 10), "entropy": torch.ones(2, 10)},
    )
    adv = torch.zeros(2, 10)
    adv[0, :5], adv[1] = 1.0, -1.0
    keys = ("gear/trigger_rate", "gear/frac_in_segments", "gear/clamp_max_share")
    _, stats = gear_reweight_stats(batch, adv, normalisation="minmax")
    stats = {k: stats[k] for k in keys}  # the per-turn W statistics: tests/credit/test_gear_turns.py
    # triggers: 4 + 1 of 15 tokens; segments: [1, 4] (4 tokens) and [2, 9] (8 tokens)
    assert stats == pytest.approx(
        {"gear/trigger_rate": 5 / 15, "gear/frac_in_segments": 12 / 15, "gear/clamp_max_share": 0.0}
    )
    out, stats = gear_reweight_stats(batch, adv, normalisation="auto")
    stats = {k: stats[k] for k in keys}
    # episode 0 switches to clamp_max: triggers 2 (tokens 2, 4), segment [2, 4]; episode 1 as before
    assert stats == pytest.approx(
        {"gear/trigger_rate": 3 / 15, "gear/frac_in_segments": 11 / 15, "gear/clamp_max_share": 0.5}
    )
    # the weights are those of gear_details with the normalisation auto picked, episode by episode
    torch.testing.assert_close(
        out[0, :5], details(FLAT, "clamp_max", segmentation="gear").advantages.float(), rtol=1e-6, atol=1e-6
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=1, max_size=30))
def test_auto_is_minmax_or_clamp_max_by_the_rule(rkl):
    auto, minmax, clamp = (details(rkl, m) for m in ("auto", "minmax", "clamp_max"))
    chosen = clamp if minmax.trigger_rate > AUTO_MAX_TRIGGER_RATE else minmax
    assert auto.normalisation == chosen.normalisation
    torch.testing.assert_close(auto.rkl_norm, chosen.rkl_norm)
    assert 0.0 <= float(auto.rkl_norm.min()) and float(auto.rkl_norm.max()) <= 1.0


def test_config_names_the_normalisation():
    # the paper states no formula (seed line 95); the preset follows spec A3: min-max, clamp_max above 20%
    assert load_config("gear-kb-multihop").algorithm.gear.normalize == "auto"
    assert (
        load_config("gear-kb-multihop", ["algorithm.gear.normalize=minmax"]).algorithm.gear.normalize
        == "minmax"
    )
    with pytest.raises(ConfigError, match="normalize"):
        load_config("gear-kb-multihop", ["algorithm.gear.normalize=zscore"])
