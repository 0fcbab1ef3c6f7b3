"""arith-tools' ``easy_max_operand``: an easy tier narrowed to what a small start knows alone (issue 32)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tasks import arith


def _key(examples):
    return [(e.question, e.answers, e.info["tier"], e.info["expression"]) for e in examples]


def test_the_default_keeps_every_earlier_question():
    # regression: the studies and demos already run draw with the default; 30 must be exactly that draw
    mixed = dict(easy_fraction=0.34, medium_fraction=0.33, tool_failure_rate=0.4)
    assert _key(arith.generate(200, seed=0, **mixed)) == _key(
        arith.generate(200, seed=0, easy_max_operand=30, **mixed)
    )
    assert _key(arith.generate(50, seed=1, split="test")) == _key(
        arith.generate(50, seed=1, split="test", easy_max_operand=arith.EASY_MAX_OPERAND)
    )


def test_ten_gives_the_one_digit_pool_by_hand():
    # by hand: sums 10 x 10 = 100, differences a in 2..10, b < a: 1 + 2 + ... + 9 = 45, products 9 x 9 = 81
    train = arith.generate(181, seed=0, easy_fraction=1.0, easy_max_operand=10)
    test = arith.generate(45, seed=0, split="test", easy_fraction=1.0, easy_max_operand=10)
    expressions = {e.info["expression"] for e in train} | {e.info["expression"] for e in test}
    assert len(expressions) == 100 + 45 + 81 == 226
    assert "10+10" in expressions and "10-9" in expressions and "10*10" in expressions
    assert not {e.info["expression"] for e in train} & {e.info["expression"] for e in test}
    with pytest.raises(ValueError, match="only find 181 distinct easy train"):
        arith.generate(182, seed=0, easy_fraction=1.0, easy_max_operand=10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), bound=st.integers(2, 30))
def test_easy_operands_stay_within_the_bound_and_other_tiers_do_not_move(seed, bound):
    mix = dict(easy_fraction=0.2, medium_fraction=0.3)
    narrowed = arith.generate(10, seed=seed, easy_max_operand=bound, **mix)
    for e in narrowed:
        assert int(e.answers[0]) == eval(e.info["expression"])  # noqa: S307 - our own arithmetic strings
        if e.info["tier"] == "easy":
            assert max(e.info["operands"]) <= bound
    # the medium and hard draws come from their own streams: the bound changes only the easy questions
    default = arith.generate(10, seed=seed, **mix)
    others = lambda exs: sorted(e.info["expression"] for e in exs if e.info["tier"] != "easy")  # noqa: E731
    assert others(narrowed) == others(default)


@pytest.mark.parametrize("bad", [1, 31, 10.0, True, "10"])
def test_a_bad_bound_names_the_option(bad):
    with pytest.raises(ValueError, match=r"easy_max_operand must be an integer in \[2, 30\]"):
        arith.generate(4, easy_max_operand=bad)
