"""arith-tools options for carl-segment's regime (issue 49): an easy tier of identities a small start answers
alone (``easy_kind: identity``), and a tool that fails only in plausible ways (``tool_failure_modes``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tasks import arith, load_task

CODES = [f"print({a}*{b})" for a in range(100, 140) for b in range(11, 61)]


def test_identity_questions_by_hand():
    easy = [e for e in arith.generate(400, 3, easy_kind="identity") if e.info["tier"] == "easy"]
    assert len(easy) == 200
    for e in easy:
        a, b = e.info["operands"]
        expression = e.info["expression"]
        assert expression in (f"{a}+0", f"{a}-0", f"{a}*1", f"1*{b}")
        n = b if expression.startswith("1*") else a
        assert 100 <= n <= 99_999 and e.answers == [str(n)]
        assert eval(expression) == n  # noqa: S307 (a canonical expression the generator wrote)
    assert len({e.info["expression"] for e in easy}) == 200  # distinct, so the tier is not memorised
    assert {e.info["kind"] for e in easy} == {"add", "sub", "mul"}  # the seen templates render every one


def test_identity_leaves_the_hard_tier_and_the_default_draws_as_they_were():
    default = arith.generate(200, 5)
    identity = arith.generate(200, 5, easy_kind="identity")
    hard = lambda xs: [e.info["expression"] for e in xs if e.info["tier"] == "hard"]  # noqa: E731
    assert hard(default) == hard(identity)
    assert [e.question for e in default] == [e.question for e in arith.generate(200, 5, easy_kind="small")]


def test_train_and_test_identities_never_meet():
    train = {e.info["expression"] for e in arith.generate(600, 0, easy_fraction=1.0, easy_kind="identity")}
    test = {
        e.info["expression"]
        for e in arith.generate(300, 0, split="test", easy_fraction=1.0, easy_kind="identity")
    }
    assert train and test and not train & test


def test_bad_options_are_one_line_errors():
    with pytest.raises(ValueError, match="easy_kind must be one of"):
        arith.generate(10, 0, easy_kind="tiny")
    with pytest.raises(ValueError, match="tool_failure_modes"):
        arith.generate(10, 0, tool_failure_modes=["late"])
    with pytest.raises(ValueError, match="tool_failure_modes"):
        arith.generate(10, 0, tool_failure_modes=[])
    with pytest.raises(ValueError, match="tool_failure_modes"):
        arith.generate(10, 0, tool_failure_modes="off_by_one")  # a string, not a list
    # through the registry, as a config's task.options reach it
    assert len(load_task("arith-tools", "train", limit=8, easy_kind="identity")) == 8


def test_off_by_one_only_fails_plausibly_and_keeps_the_failing_programs():
    """Narrowing the modes changes how a failing program fails, never which programs fail."""
    every = [arith.tool_failure(c, 0.3, 11) for c in CODES]
    plausible = [arith.tool_failure(c, 0.3, 11, ["off_by_one"]) for c in CODES]
    assert [m is None for m in every] == [m is None for m in plausible]
    assert set(plausible) == {None, "off_by_one"}
    tool = arith.failing_tool(lambda args: "391\n", 1.0, 0, ["off_by_one"])
    assert tool({"code": "print(17*23)"}) in ("390\n", "392\n")


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), modes=st.sets(st.sampled_from(arith.TOOL_FAILURE_MODES), min_size=1))
def test_failures_use_only_the_modes_asked_for(seed, modes):
    got = {arith.tool_failure(c, 0.5, seed, sorted(modes)) for c in CODES[:300]}
    assert got - {None} <= modes
