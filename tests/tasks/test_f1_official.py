"""F1 follows the official SQuAD v1.1 and HotpotQA evaluation scripts (issue 11, item 4).

Both scripts compute ``num_same = sum((Counter(pred) & Counter(gold)).values())`` and return 0 when it is 0, so
a prediction and a gold that both normalise to nothing (articles or punctuation only) score F1 = 0, even though
their normalised strings are equal (exact match 1). agentcredit used to return 1.0 for that case.
"""

from __future__ import annotations

import pytest

from agentcredit.tasks.scoring import exact_match, f1_score, score


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("the", "a"), ("", ""), ("an", "..."), ("The!", "a the"), ("", "the")],
)
def test_f1_of_two_empty_normalisations_is_zero(prediction, gold):
    assert f1_score(prediction, gold) == 0.0
    assert score(prediction, gold, metric="f1") == 0.0


def test_exact_match_of_two_empty_normalisations_is_still_one():
    # the official EM compares the normalised strings: "" == "" counts, as in the official scripts
    assert exact_match("the", "a") == 1.0


def test_f1_unchanged_otherwise():
    assert f1_score("The Beatles", "Beatles") == 1.0
    assert f1_score("the quick brown fox", "quick fox jumps") == pytest.approx(2 / 3)
    assert f1_score("the", ["a", "the cat"]) == 0.0
    assert f1_score("cat", ["a", "the cat"]) == 1.0
