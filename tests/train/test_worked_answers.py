"""Worked direct answers in the arith-tools demonstrations (start.sft.direct_answers, issue 32's start selection).

The arith-tool-can-hurt start's own arithmetic at T = 1 was the binding limit (easy tier alone 0.545). A probe
(the start selection in docs/results/arith-tool-can-hurt/) found that direct answers showing their steps lifted easy
no-tool accuracy 0.50 -> 0.75 on 16 training questions; ``worked`` makes that a tested option of the demonstrations.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import load_config
from agentcredit.lab.study import SftSpec, StudyError, load_study
from agentcredit.tasks import Example, arith
from agentcredit.train.demos import codefence_policy, direct_answer, scripted_policy, worked_steps


def question(
    kind: str, operands: tuple[int, ...], expression: str, value: int, tier: str = "easy"
) -> Example:
    info = {"tier": tier, "kind": kind, "expression": expression, "operands": list(operands)}
    return Example(
        id=f"q-{expression}",
        question=f"What is {expression}?",
        answers=[str(value)],
        task="arith-tools",
        info=info,
    )


# ------------------------------------------------------------------------------------------------ by hand
# (kind, operands, expression, value, tier, the worked text before ". The answer is \boxed{value}.")
HAND_WORKED = [
    # a sum with a two-digit second operand: tens first (the probe's "28+10 = 38, 38+5 = 43")
    ("add", (28, 15), "28+15", 43, "easy", "28+10 = 38, 38+5 = 43"),
    ("add", (8, 19), "8+19", 27, "easy", "8+10 = 18, 18+9 = 27"),
    ("add", (12, 20), "12+20", 32, "easy", "12+20 = 32"),  # a round ten is one step
    ("add", (47, 68), "47+68", 115, "medium", "47+60 = 107, 107+8 = 115"),
    # a sum with a one-digit second operand: directly (the probe's steps format did the same)
    ("add", (38, 5), "38+5", 43, "easy", "38+5 = 43"),
    ("add", (4, 3), "4+3", 7, "easy", "4+3 = 7"),
    # a difference with a two-digit second operand: tens first, then the one-digit rest (down to a ten if it crosses)
    ("sub", (79, 46), "79-46", 33, "medium", "79-40 = 39, 39-6 = 33"),
    ("sub", (83, 37), "83-37", 46, "medium", "83-30 = 53, 53-3 = 50, 50-4 = 46"),
    ("sub", (47, 28), "47-28", 19, "medium", "47-20 = 27, 27-7 = 20, 20-1 = 19"),
    ("sub", (16, 13), "16-13", 3, "easy", "16-10 = 6, 6-3 = 3"),
    ("sub", (30, 20), "30-20", 10, "easy", "30-20 = 10"),
    # a difference with a one-digit second operand that crosses a ten: down to the ten first
    ("sub", (15, 8), "15-8", 7, "easy", "15-8: 15-5 = 10, 10-3 = 7"),
    ("sub", (13, 9), "13-9", 4, "easy", "13-9: 13-3 = 10, 10-6 = 4"),
    ("sub", (24, 9), "24-9", 15, "easy", "24-9: 24-4 = 20, 20-5 = 15"),
    # ... and directly when it stays within its ten, lands on it, starts from it or is below ten
    ("sub", (18, 6), "18-6", 12, "easy", "18-6 = 12"),
    ("sub", (15, 5), "15-5", 10, "easy", "15-5 = 10"),
    ("sub", (20, 3), "20-3", 17, "easy", "20-3 = 17"),
    ("sub", (9, 4), "9-4", 5, "easy", "9-4 = 5"),
    # a product of operands up to 10: count up by the larger, as many terms as the smaller
    ("mul", (7, 4), "7*4", 28, "easy", "4 times 7: 7, 14, 21, 28, so 7*4 = 28"),
    ("mul", (2, 2), "2*2", 4, "easy", "2 times 2: 2, 4, so 2*2 = 4"),
    ("mul", (3, 10), "3*10", 30, "easy", "3 times 10: 10, 20, 30, so 3*10 = 30"),
    # shapes with no worked form are answered directly: the medium tier's products and every hard kind
    ("mul", (17, 6), "17*6", 102, "medium", "17*6 = 102"),
    ("mul", (347, 28), "347*28", 9716, "hard", "347*28 = 9716"),
    ("mul_add", (23, 45, 678), "23*45+678", 1713, "hard", "23*45+678 = 1713"),
    ("sum_mul", (123, 456, 12), "(123+456)*12", 6948, "hard", "(123+456)*12 = 6948"),
    ("mul_sub", (40, 64, 33, 64), "40*64-33*64", 448, "hard", "40*64-33*64 = 448"),
    ("div", (9716, 28), "9716//28", 347, "hard", "9716//28 = 347"),
]


@pytest.mark.parametrize("kind, operands, expression, value, tier, worked", HAND_WORKED)
def test_worked_direct_answers_by_hand(kind, operands, expression, value, tier, worked):
    example = question(kind, operands, expression, value, tier)
    assert direct_answer(example, "worked") == f"{worked}. The answer is \\boxed{{{value}}}."
    # plain is today's demonstration, unchanged
    assert direct_answer(example, "plain") == f"{expression} = {value}. The answer is \\boxed{{{value}}}."


def test_the_policy_writes_worked_answers_only_where_it_answers_without_the_tool():
    example = question("add", (28, 15), "28+15", 43)
    assert codefence_policy(example, 0, None, tool_share=0.0) == "28+15 = 43. The answer is \\boxed{43}."
    assert codefence_policy(example, 0, None, tool_share=0.0, direct_answers="worked") == (
        "28+10 = 38, 38+5 = 43. The answer is \\boxed{43}."
    )
    called = codefence_policy(example, 0, None, tool_share=1.0, direct_answers="worked")
    assert called == codefence_policy(example, 0, None, tool_share=1.0)  # a tool call is untouched
    assert "```python" in called


def test_a_bad_style_or_protocol_is_refused():
    with pytest.raises(ValueError, match="direct_answers must be one of"):
        direct_answer(question("add", (1, 2), "1+2", 3), "chatty")
    with pytest.raises(ValueError, match="direct_answers must be one of"):
        scripted_policy("codefence", direct_answers="chatty")
    with pytest.raises(ValueError, match="codefence protocol only"):
        scripted_policy("jsoncall", direct_answers="worked")
    scripted_policy("jsoncall", direct_answers="plain")  # the default changes nothing


# ------------------------------------------------------------------------------------------------ properties
STEP = re.compile(r"(\d+)([+-])(\d+) = (\d+)")


def check_worked(kind: str, operands: tuple[int, ...], value: int) -> bool:
    """Every step of the worked text is true arithmetic, each starts where the last ended, the first starts at the
    first operand, the step operands add up to the second operand and the last step ends at ``value``. False when
    the shape has no worked form."""
    text = worked_steps(kind, operands)
    if text is None:
        return False
    a, b = operands
    if kind == "mul":
        head, tail = text.split(", so ")
        assert tail == f"{a}*{b} = {value}"
        n_m, counts = head.split(": ")
        n, m = (int(x) for x in n_m.split(" times "))
        assert (n, m) == (min(a, b), max(a, b))
        assert [int(c) for c in counts.split(", ")] == [m * i for i in range(1, n + 1)]
        assert m * n == value
        return True
    if text.startswith(f"{a}-{b}: "):  # a crossing difference names its expression first
        text = text[len(f"{a}-{b}: ") :]
    current, moved = a, 0
    for step in text.split(", "):
        match = STEP.fullmatch(step)
        assert match, step
        x, sign, y, z = int(match[1]), match[2], int(match[3]), int(match[4])
        assert x == current and sign == ("+" if kind == "add" else "-")
        assert z == (x + y if sign == "+" else x - y) and z >= 0
        current, moved = z, moved + y
    assert moved == b and current == value
    return True


def test_every_easy_and_medium_sum_and_difference_is_worked_correctly():
    """The whole space the generator draws sums and differences from (arith._easy, arith._medium)."""
    spaces = [
        ("add", range(1, 31), lambda a: range(1, 31)),
        ("sub", range(2, 31), lambda a: range(1, a)),
        ("add", range(31, 100), lambda a: range(31, 100)),
        ("sub", range(50, 100), lambda a: range(11, a - 10)),
    ]
    for kind, firsts, seconds in spaces:
        for a in firsts:
            for b in seconds(a):
                value = a + b if kind == "add" else a - b
                worked = check_worked(kind, (a, b), value)
                assert worked == (b >= 10 or (kind == "sub" and a >= 10 and 0 < a % 10 < b))
    for a in range(2, 11):
        for b in range(2, 11):
            assert check_worked("mul", (a, b), a * b)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(arith.TIERS), st.integers(0, 2**32 - 1))
def test_every_expression_the_generator_makes_ends_at_its_exact_answer(tier, seed):
    kind, operands, expression, value = arith._DRAW[tier](random.Random(seed))
    example = question(kind, operands, expression, value, tier)
    text = direct_answer(example, "worked")
    assert text.endswith(f". The answer is \\boxed{{{value}}}.")
    steps = worked_steps(kind, operands)
    if steps is None:
        assert text == direct_answer(example, "plain")
        if kind in ("add", "sub"):  # a one-digit second operand that does not cross a ten downwards
            a, b = operands
            assert b < 10 and not (kind == "sub" and a >= 10 and 0 < a % 10 < b)
    else:
        assert check_worked(kind, operands, value)
        assert tier != "hard"  # the hard tier has no worked shape: always direct


# ------------------------------------------------------------------------------------------------ the setting
def test_sft_spec_direct_answers_defaults_to_plain_and_keeps_old_fingerprints():
    assert SftSpec().direct_answers == "plain"
    assert "direct_answers" not in SftSpec().model_dump()  # pinned starts keep their fingerprint
    assert SftSpec(direct_answers="worked").model_dump()["direct_answers"] == "worked"
    with pytest.raises(ValidationError, match="direct_answers"):
        SftSpec(direct_answers="chatty")


def study_text(direct_answers: str) -> str:
    text = open("studies/arith-tool-can-hurt.yaml").read()
    old = "    prompts: {optional: 0.25, forced: 0.25, no_tool: 0.5}\n"
    assert text.count(old) == 1
    return text.replace(old, old + f"    direct_answers: {direct_answers}\n")


def test_a_bad_direct_answers_in_a_study_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(study_text("chatty"))
    with pytest.raises(StudyError, match=r"start\.sft\.direct_answers"):
        load_study(bad)
    result = CliRunner().invoke(app, ["study", "--config", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "direct_answers" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_study_start_passes_worked_direct_answers_to_sft(tmp_path, monkeypatch):
    import agentcredit.run as run
    from agentcredit.lab.study import Study

    seen: dict = {}
    monkeypatch.setattr(run, "run_sft", lambda cfg, out_dir, **kw: seen.update(kw))
    good = tmp_path / "worked.yaml"
    good.write_text(study_text("worked"))
    Study(load_study(good), tmp_path / "s", log=lambda _: None).sft()
    assert seen["direct_answers"] == "worked"
    seen.clear()
    Study(load_study("studies/arith-tool-can-hurt.yaml"), tmp_path / "p", log=lambda _: None).sft()
    assert seen["direct_answers"] == "plain"


def test_worked_demonstrations_replay_and_score_as_correct():
    """Played through the real protocol and scorer: every worked no-tool demonstration is kept (reward 1)."""
    from agentcredit.models.loading import load_base_model
    from agentcredit.run import _prompted_demonstrations

    cfg = load_config(
        "carl-segment-arith-tools",
        ["model.name=tiny", "task.options={easy_fraction: 0.5, medium_fraction: 0.25}"],
    )
    _, tokenizer = load_base_model("tiny", cfg.model.dtype)
    data = arith.generate(24, seed=3, easy_fraction=0.5, medium_fraction=0.25)
    trees, per_prompt = _prompted_demonstrations(
        cfg, tokenizer, data, {"no_tool": 1.0}, 0.5, None, lambda _: None, direct_answers="worked"
    )
    assert per_prompt == {"no_tool": len(data)} and len(trees) == len(data)
    texts = [tree.segment(1).text for tree in trees]
    worked = [e for e in data if worked_steps(e.info["kind"], tuple(e.info["operands"])) is not None]
    assert worked  # the mix holds worked shapes
    for example in worked:
        assert any(worked_steps(example.info["kind"], tuple(example.info["operands"])) in t for t in texts)
