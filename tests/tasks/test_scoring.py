import sys
import threading
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcredit.tasks import scoring
from agentcredit.tasks.scoring import (
    METRICS,
    exact_match,
    extract_boxed,
    extract_tagged,
    f1_score,
    is_abstention,
    math_equal,
    normalize_answer,
    numeric_match,
    outcome_with_abstention,
    parse_number,
    passes_action_format,
    score,
    set_f1_score,
    substring_match,
)

# ---------------------------------------------------------------------------------------------------
# Extraction (hand-checked)


def test_extract_boxed_nested_and_last():
    assert extract_boxed(r"so the answer is \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{a{b{c}}d}") == "a{b{c}}d"
    assert extract_boxed(r"first \boxed{1} then \boxed{ 2 }") == "2"
    assert extract_boxed(r"\boxed{3} and an unclosed \boxed{4") == "3"
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed("no box here") is None


def test_extract_tagged_last_complete():
    assert extract_tagged("<answer>a</answer> x <answer> b </answer>") == "b"
    assert extract_tagged("<answer>a</answer><answer>open") == "a"
    assert extract_tagged("<search>q</search>", "search") == "q"
    assert extract_tagged("nothing") is None


# ---------------------------------------------------------------------------------------------------
# SQuAD normalisation, EM, F1 (tips.md 5; carl-segment.md 6.4)


def test_normalize_answer_squad():
    assert normalize_answer("The  Quick, Brown fox!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    # Only ASCII punctuation is removed, as in the official script.
    assert normalize_answer("Janet’s") == "janet’s"


def test_exact_match_aliases_and_missing():
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"]) == 1.0
    assert exact_match("Paris", ["London", "paris"]) == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0
    assert exact_match(None, "Paris") == 0.0


def test_f1_hand_worked():
    # pred {quick, brown, fox}, gold {quick, fox, jumps}: 2 common, P = R = 2/3 -> F1 = 2/3.
    assert f1_score("the quick brown fox", "quick fox jumps") == pytest.approx(2 / 3)
    # Bag of tokens: pred [x, x, y] vs gold [x, y]: 2 common, P = 2/3, R = 1 -> F1 = 0.8.
    assert f1_score("x x y", "x y") == pytest.approx(0.8)
    assert f1_score("x y", ["z", "x y"]) == 1.0
    assert f1_score("", "x") == 0.0
    assert f1_score(None, "x") == 0.0


def test_substring_rule_multiword_only():
    # carl-segment: a multi-word gold inside the normalised prediction counts.
    assert substring_match("He was born in New York City.", "New York") == 1.0
    assert exact_match("He was born in New York City.", "New York") == 0.0
    # Single-word golds still need an exact match ("1" is in "1985" but must not count).
    assert substring_match("born in 1985", "1") == 0.0
    assert substring_match("1985", "1985") == 1.0
    # The paper's rule is a character substring, so it also fires inside a longer word.
    assert substring_match("a new yorker", "New York") == 1.0
    assert substring_match(None, "New York") == 0.0


# ---------------------------------------------------------------------------------------------------
# carl-critical: ASearcher's set F1 and format gate (spec 2.5)


def test_set_f1_hand_worked():
    # Articles stay: {the, beatles} vs {beatles}: P = 1/2, R = 1 -> 2/3 (SQuAD F1 would say 1).
    assert set_f1_score("The Beatles", "Beatles") == pytest.approx(2 / 3)
    assert f1_score("The Beatles", "Beatles") == 1.0
    # Sets: repeated words do not count twice.
    assert set_f1_score("x x y", "x y") == 1.0
    # Punctuation becomes a space: "u.s." -> {u, s}.
    assert set_f1_score("U.S.", "u s") == 1.0
    assert set_f1_score("True", "yes") == 1.0 and set_f1_score("False", ["no"]) == 1.0
    assert set_f1_score("", "x") == 0.0 and set_f1_score("...", "x") == 0.0


def test_set_f1_aug_answer_mixing():
    # base: {new, york, city} vs {new, york}: P = 2/3, R = 1 -> 0.8; aug F1 = 1 -> 0.7*0.8 + 0.3*1 = 0.86.
    assert set_f1_score("new york city", "new york", aug_golds="new york city") == pytest.approx(0.86)
    # aug worse than gold: 0.7 F1 + 0.3 F1 = F1.
    assert set_f1_score("new york", "new york", aug_golds="paris") == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("action", "ok"),
    [
        ("<think>plan</think><search>who</search>", True),
        ("<think>done</think><answer>Paris</answer>", True),
        ("no tags at all", True),
        ("<search>q</search><answer>a</answer>", False),  # two actions opened
        ("<search>q", False),  # unbalanced
        ("<think>a</think></think><answer>x</answer>", False),  # two </think>
        ("<answer>x</answer> assistant", False),
        ("Assistant: <answer>x</answer>", False),
    ],
)
def test_action_format_gate(action, ok):
    assert passes_action_format(action) is ok


# ---------------------------------------------------------------------------------------------------
# Numbers (carl-segment A16)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("#### 1,234", 1234),
        ("$18.00", 18),
        ("18.", 18),
        ("-7", -7),
        ("\u22125", -5),
        ("12.5%", Fraction(25, 2)),
        (r"\boxed{\frac{1}{2}}", Fraction(1, 2)),
        (r"-\dfrac{3}{4}", Fraction(-3, 4)),
        ("1/2", Fraction(1, 2)),
        (r"\$1{,}000", 1000),
        (r"\text{42}", 42),
        ("1e3", 1000),
        (".5", Fraction(1, 2)),
    ],
)
def test_parse_number_forms(text, value):
    assert parse_number(text, strict=True) == value


def test_parse_number_flexible_takes_last_number():
    assert parse_number("She makes 9 * 2 = 18 dollars.") == 18
    assert parse_number("She makes 18 dollars.", strict=True) is None
    assert parse_number("no digits") is None
    assert parse_number("1/0", strict=True) is None


def test_parse_number_survives_absurd_model_output():
    # A billion-digit exponent or a 5,000-digit integer (over Python's int/str limit) is "not a number".
    assert parse_number("1e999999999") is None
    assert parse_number("1" * 5000) is None
    assert numeric_match("1e999999999", "18") == 0.0
    assert parse_number("2.5e3", strict=True) == 2500


def test_numeric_match_gsm8k():
    assert numeric_match("#### 1,234", "1234") == 1.0
    assert numeric_match("$18.00", "18") == 1.0
    assert numeric_match("18.0", "#### 18") == 1.0
    assert numeric_match("18.5", "18") == 0.0
    # Absolute tolerance 1e-6.
    assert numeric_match("0.1000001", "0.1") == 1.0
    assert numeric_match("0.10001", "0.1") == 0.0
    # Exact arithmetic: large integers one apart differ (a float comparison would call them equal).
    assert numeric_match("100000000000000000001", "100000000000000000000") == 0.0
    assert numeric_match(None, "18") == 0.0
    assert numeric_match("eighteen", "18") == 0.0


def test_numeric_match_finqa_tolerance_and_percent_forms():
    gold = "1.42403"
    # |1.43 - 1.42403| / 1.43 = 0.0042 <= 1e-2.
    assert score("1.43", gold, metric="finqa") == 1.0
    # Written as a percentage: 142.4 vs 100 * gold = 142.403.
    assert score("142.4%", gold, metric="finqa") == 1.0
    assert score("1.5", gold, metric="finqa") == 0.0  # 5% off
    assert score("1.43", gold, metric="numeric") == 0.0


def test_numeric_match_rejects_non_numeric_gold():
    with pytest.raises(ValueError, match="not a number"):
        numeric_match("5", "five")


def test_math_equal_with_math_verify():
    pytest.importorskip("math_verify")
    assert math_equal(r"\frac{1}{2}", "0.5") == 1.0
    assert math_equal(r"\sqrt{2}", r"\sqrt 2") == 1.0
    assert math_equal("3", "4") == 0.0
    assert math_equal(None, "4") == 0.0
    # math-verify's timeout uses signal.alarm, which fails outside the main thread; we turn it off there.
    results = []
    thread = threading.Thread(target=lambda: results.append(math_equal(r"\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_equal_fallback_without_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    monkeypatch.setattr(scoring, "_MATH_VERIFY_WARNED", False)
    with pytest.warns(UserWarning, match="math-verify is not installed"):
        assert math_equal(r"\frac{1}{2}", "0.5") == 1.0
    assert math_equal(r"\sqrt{2}", r"\sqrt{2}") == 1.0  # a symbolic gold falls back to exact match
    assert math_equal(r"\sqrt{2}", r"\sqrt 2") == 0.0  # ... which cannot see these are equal
    assert math_equal("3", "4") == 0.0


# ---------------------------------------------------------------------------------------------------
# Abstention and PORTool's ternary outcome (portool.md 3.1)


@pytest.mark.parametrize(
    "text",
    [
        "I am unable to answer this question.",
        "unable_to_answer",
        "The answer cannot be determined from the available data.",
        "I don't know.",
        "I couldn’t find the stock price.",
        "There is not enough information to say.",
        "Unknown",
        "N/A",
    ],
)
def test_is_abstention_true(text):
    assert is_abstention(text)


@pytest.mark.parametrize("text", ["Paris", "", "The known answer is 42", "None of them", "unknownland"])
def test_is_abstention_false(text):
    assert not is_abstention(text)


def test_outcome_with_abstention():
    assert outcome_with_abstention("Paris", "paris") == 1.0
    assert outcome_with_abstention("I am unable to answer.", "paris") == 0.0
    assert outcome_with_abstention("London", "paris") == -1.0
    assert outcome_with_abstention(None, "paris") == -1.0
    assert outcome_with_abstention(None, "paris", unfinished=0.0) == 0.0
    assert outcome_with_abstention("$18.00", "18", metric="numeric") == 1.0


def test_score_dispatch():
    assert set(METRICS) == {"em", "f1", "set_f1", "substring", "numeric", "finqa", "math"}
    assert score("The Eiffel Tower", "eiffel tower") == 1.0
    assert score("x x y", "x y", metric="f1") == pytest.approx(0.8)
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        score("a", "a", metric="bleu")


def test_bad_gold_type_is_a_clear_error():
    with pytest.raises(ValueError, match="gold answer 1 must be a string"):
        exact_match("a", ["a", 3])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------------
# Properties

texts = st.text(max_size=40)
wordy = st.text(alphabet=st.sampled_from("ab xyzThe,.!'-"), max_size=30)


@given(texts)
def test_normalisation_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@given(st.one_of(texts, wordy), st.one_of(texts, wordy))
def test_metric_bounds(pred, gold):
    em, f1 = exact_match(pred, gold), f1_score(pred, gold)
    assert em in (0.0, 1.0)
    assert 0.0 <= f1 <= 1.0
    if normalize_answer(gold):  # official SQuAD/HotpotQA F1: two empty normalisations score EM 1, F1 0
        assert em <= f1
    assert em <= substring_match(pred, gold) <= 1.0
    assert 0.0 <= set_f1_score(pred, gold) <= 1.0


@given(st.one_of(texts, wordy))
def test_identity_scores_one(text):
    assert exact_match(text, text) == 1.0
    assert f1_score(text, text) == (1.0 if normalize_answer(text) else 0.0)  # official scripts: empty -> 0
    assert substring_match(text, text) == 1.0


@given(wordy, st.lists(wordy, min_size=1, max_size=4))
def test_max_over_aliases(pred, golds):
    for metric in ("em", "f1", "set_f1", "substring"):
        assert score(pred, golds, metric=metric) == max(score(pred, g, metric=metric) for g in golds)


@given(wordy, wordy)
def test_f1_is_symmetric(a, b):
    assert f1_score(a, b) == pytest.approx(f1_score(b, a))
    assert set_f1_score(a, b) == pytest.approx(set_f1_score(b, a))


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_integer_formats_match(n):
    gold = str(n)
    assert numeric_match(f"{n:,}", gold) == 1.0
    assert numeric_match(f"#### {n:,}", gold) == 1.0
    assert numeric_match(f"${n}.00", gold) == 1.0
    assert numeric_match(f"{n}.0", gold) == 1.0
    assert numeric_match(rf"\boxed{{{n}}}", gold) == 1.0
    assert numeric_match(str(n + 1), gold) == 0.0


@given(st.decimals(min_value=-1000, max_value=1000, allow_nan=False, allow_infinity=False, places=4))
def test_parse_number_round_trips_decimals(value):
    assert parse_number(str(value), strict=True) == Fraction(value)


@given(st.text(max_size=60))
def test_scorers_never_crash_on_model_text(text):
    for metric in ("em", "f1", "set_f1", "substring", "numeric", "finqa"):
        assert 0.0 <= score(text, "42", metric=metric) <= 1.0
    assert isinstance(is_abstention(text), bool)
    assert isinstance(passes_action_format(text), bool)


def test_answer_reward_is_the_metric_plus_the_format_bonus():
    """Both trainers' outcome reward (issue 14: it was written twice): no answer 0, else metric + bonus."""
    from agentcredit.tasks.scoring import answer_reward

    assert answer_reward(None, ["Paris"], format_bonus=0.2) == 0.0
    assert answer_reward("Paris", ["Paris"], format_bonus=0.2) == 1.2
    assert answer_reward("Rome", ["Paris"], format_bonus=0.2) == 0.2
    assert answer_reward("60450", ["60,450"], metric="numeric") == 1.0
