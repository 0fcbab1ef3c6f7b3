import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit.metrics import (
    auc,
    brier_score,
    calibration_error,
    expected_calibration_error,
    explained_variance,
    reliability_table,
    sign_accuracy,
)


def test_auc_hand_computed():
    # positives 0.9, 0.4; negatives 0.5, 0.1: pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) -> 3/4
    assert auc([0.9, 0.4, 0.5, 0.1], [1, 1, 0, 0]) == pytest.approx(0.75)
    assert auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # a tie counts one half
    assert math.isnan(auc([0.1, 0.2], [1, 1]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 1)), min_size=2, max_size=30))
def test_auc_matches_pairwise_definition(pairs):
    s = [p[0] for p in pairs]
    y = [p[1] for p in pairs]
    pos = [a for a, b in pairs if b == 1]
    neg = [a for a, b in pairs if b == 0]
    if not pos or not neg:
        assert math.isnan(auc(s, y))
        return
    direct = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])
    assert auc(s, y) == pytest.approx(direct)


def test_ece_hand_computed():
    # bin [0.1, 0.2): p = 0.1, 0.1, outcomes 0, 1 -> |0.5 - 0.1| * 2/4; bin [0.9, 1]: p = 0.9, 0.9, outcomes 1, 1 -> 0.1 * 2/4
    assert expected_calibration_error([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1]) == pytest.approx(0.2 + 0.05)
    table = reliability_table([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1])
    assert (
        table[1]["count"] == 2 and table[1]["observed"] == 0.5 and table[9]["predicted"] == pytest.approx(0.9)
    )
    with pytest.raises(ValueError, match="probabilities"):
        expected_calibration_error([1.5], [1])


def test_explained_variance_and_sign_accuracy():
    assert explained_variance([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert explained_variance([0.5] * 4, [0, 1, 0, 1]) == pytest.approx(0.0)
    assert math.isnan(explained_variance([0.2, 0.3], [1, 1]))
    assert sign_accuracy([0.2, -0.1, 0.0, 0.3], [True, False, True, False]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="equally long"):
        auc([0.1], [1, 0])


# carl-segment Tab. 11 (carl-segment.md §7.6): observed success rate and count per V(s0) decile, and the paper's ECE.
TAB11 = {
    "7B curated": (
        [0.120, 0.182, 0.281, 0.319, 0.381, 0.590, 0.680, 0.686, 0.817, 0.918],
        [305, 285, 245, 225, 195, 215, 235, 270, 295, 220],
        0.0435,
    ),
    "7B random": (
        [0.304, 0.345, 0.407, 0.384, 0.431, 0.504, 0.530, 0.610, 0.610, 0.635],
        [175, 215, 260, 290, 310, 305, 280, 240, 215, 210],
        0.1368,
    ),
    "7B cold": (
        [0.519, 0.472, 0.487, 0.446, 0.480, 0.507, 0.473, 0.527, 0.502, 0.518],
        [255, 250, 252, 248, 250, 245, 252, 256, 248, 244],
        0.2380,
    ),
    "3B curated": (
        [0.158, 0.221, 0.298, 0.355, 0.428, 0.541, 0.624, 0.692, 0.758, 0.832],
        [320, 290, 245, 220, 195, 215, 235, 270, 285, 215],
        0.0593,
    ),
    "3B random": (
        [0.331, 0.378, 0.412, 0.405, 0.448, 0.498, 0.535, 0.589, 0.611, 0.628],
        [188, 220, 265, 285, 305, 300, 280, 245, 220, 215],
        0.1471,
    ),
    "3B cold": (
        [0.487, 0.501, 0.476, 0.455, 0.479, 0.514, 0.482, 0.517, 0.493, 0.512],
        [252, 248, 253, 247, 251, 246, 250, 254, 247, 245],
        0.2379,
    ),
}


@pytest.mark.parametrize("name", sorted(TAB11))
def test_midpoint_ece_reproduces_paper_table_11(name):
    # carl-segment.md §6 [I]: with conf_b = bin midpoint the paper's six ECE values come out exactly (to 4 decimals)
    observed, counts, paper = TAB11[name]
    rows = [
        {"low": b / 10, "high": (b + 1) / 10, "count": n, "observed": o, "predicted": float("nan")}
        for b, (o, n) in enumerate(zip(observed, counts, strict=True))
    ]
    assert calibration_error(rows, confidence="midpoint") == pytest.approx(paper, abs=5e-5)


def test_ece_mean_and_midpoint_variants_by_hand():
    # one bin [0.2, 0.3): V = 0.21, 0.23 (mean 0.22), outcomes 1, 0 (rate 0.5)
    # mean variant |0.5 - 0.22| = 0.28; midpoint variant |0.5 - 0.25| = 0.25
    assert expected_calibration_error([0.21, 0.23], [1, 0]) == pytest.approx(0.28)
    assert expected_calibration_error([0.21, 0.23], [1, 0], confidence="midpoint") == pytest.approx(0.25)
    with pytest.raises(ValueError, match="confidence"):
        expected_calibration_error([0.2], [1], confidence="median")
    # V = 1.0 falls in the last bin (closed on the right)
    assert reliability_table([1.0], [1])[9]["count"] == 1


def test_brier_score_by_hand():
    # (0.8-1)^2 = 0.04, (0.3-0)^2 = 0.09, (0.5-1)^2 = 0.25 -> mean 0.38 / 3
    assert brier_score([0.8, 0.3, 0.5], [1, 0, 1]) == pytest.approx(0.38 / 3)
    assert math.isnan(brier_score([], []))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 1)), min_size=1, max_size=40))
def test_ece_bounds_and_variants_close(pairs):
    p = [a for a, _ in pairs]
    y = [b for _, b in pairs]
    mean_variant = expected_calibration_error(p, y)
    mid_variant = expected_calibration_error(p, y, confidence="midpoint")
    assert 0.0 <= mean_variant <= 1.0 and 0.0 <= mid_variant <= 1.0
    # conf_b moves by at most half a bin width between the two variants
    assert abs(mean_variant - mid_variant) <= 0.05 + 1e-12
    assert sum(r["count"] for r in reliability_table(p, y)) == len(p)
