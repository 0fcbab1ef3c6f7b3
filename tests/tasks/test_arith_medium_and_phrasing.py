"""arith-tools' medium tier and held-out phrasings, and the demonstrations' fixed tool share."""

from __future__ import annotations

from collections import Counter

import pytest

from agentcredit.tasks import arith, load_task
from agentcredit.train.demos import calls_tool, codefence_policy


def _key(examples):
    return [(e.question, e.answers, e.info["tier"], e.info["expression"]) for e in examples]


def test_no_medium_questions_leaves_every_earlier_question_unchanged():
    assert _key(arith.generate(120, seed=3)) == _key(arith.generate(120, seed=3, medium_fraction=0.0))
    # the easy and hard draws of a seed do not depend on how many medium questions are asked for
    with_medium = arith.generate(90, seed=3, easy_fraction=1 / 3, medium_fraction=1 / 3)
    without = arith.generate(60, seed=3, easy_fraction=0.5)
    same_tier = lambda exs, t: {e.info["expression"] for e in exs if e.info["tier"] == t}  # noqa: E731
    assert same_tier(with_medium, "easy") == same_tier(without, "easy")
    assert same_tier(with_medium, "hard") == same_tier(without, "hard")


def test_medium_tier_counts_ranges_and_answers():
    examples = arith.generate(300, seed=0, easy_fraction=0.34, medium_fraction=0.33)
    tiers = Counter(e.info["tier"] for e in examples)
    assert tiers == {"easy": 102, "medium": 99, "hard": 99}
    for e in examples:
        assert int(e.answers[0]) == eval(e.info["expression"])  # noqa: S307 - our own arithmetic strings
        if e.info["tier"] == "medium":
            assert e.info["kind"] in ("add", "sub", "mul")
            assert max(e.info["operands"]) >= 11  # beyond the easy tier's ranges
    with pytest.raises(ValueError, match="easy_fraction \\+ medium_fraction"):
        arith.generate(10, easy_fraction=0.7, medium_fraction=0.4)


def test_new_phrasings_never_occur_in_training_templates():
    seen = arith.generate(400, seed=0, split="test", easy_fraction=0.34, medium_fraction=0.33)
    new = arith.generate(400, seed=0, split="test", easy_fraction=0.34, medium_fraction=0.33, phrasing="new")
    seen_templates = {e.info["template"] for e in seen}
    new_templates = {e.info["template"] for e in new}
    assert seen_templates.isdisjoint(new_templates) and all(t.startswith("new-") for t in new_templates)
    assert len(new_templates) >= 8
    # no question text of the new set could be produced by a seen template
    seen_openings = {q.split("{")[0] for q in arith._PLAIN} | {w.split("{")[0] for w in arith._WORD.values()}
    assert not any(e.question.startswith(tuple(o for o in seen_openings if o)) for e in new)
    assert {e.id for e in seen}.isdisjoint({e.id for e in new})
    assert any(" plus " in e.question or " minus " in e.question for e in new)
    # the new set asks the same arithmetic in other words (a paired comparison with the seen set)
    assert [e.info["expression"] for e in new] == [e.info["expression"] for e in seen]


def test_new_phrasings_are_held_out_from_training():
    with pytest.raises(ValueError, match="held out for evaluation"):
        load_task("arith-tools", split="train", limit=4, phrasing="new")
    with pytest.raises(ValueError, match="phrasing must be one of"):
        arith.generate(4, split="test", phrasing="odd")


def test_tool_share_is_fixed_and_independent_of_the_tier():
    examples = arith.generate(600, seed=1, easy_fraction=0.34, medium_fraction=0.33)
    for share in (0.0, 0.5, 1.0):
        by_tier = Counter(e.info["tier"] for e in examples if calls_tool(e, share))
        total = sum(by_tier.values())
        assert abs(total / len(examples) - share) < 0.06
        if 0 < share < 1:
            for tier in ("easy", "medium", "hard"):  # about the same share within every tier
                n_tier = sum(1 for e in examples if e.info["tier"] == tier)
                assert abs(by_tier[tier] / n_tier - share) < 0.1
    # by tier when no share is given: the original scripts
    assert [calls_tool(e, None) for e in examples] == [e.info["tier"] != "easy" for e in examples]
    assert calls_tool(examples[0], 0.5) == calls_tool(examples[0], 0.5)  # deterministic


def test_direct_answer_and_tool_call_demonstrations():
    easy, hard = (
        next(e for e in arith.generate(40, seed=2) if e.info["tier"] == t) for t in ("easy", "hard")
    )
    assert "```python" in codefence_policy(easy, 0, None, tool_share=1.0)
    assert "\\boxed{" in codefence_policy(hard, 0, None, tool_share=0.0)
    assert "```python" not in codefence_policy(hard, 0, None, tool_share=0.0)
