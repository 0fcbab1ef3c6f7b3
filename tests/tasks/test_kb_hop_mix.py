"""kb-multihop's training hop mix, ``task.options.train_hop_fractions`` (issue 32: an easier training mix for a
135M start). Default: the equal thirds the generator always made; held-out splits never follow the option."""

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentcredit.tasks import kb, load_task


def _hops(examples) -> dict[int, int]:
    return dict(Counter(ex.info["hops"] for ex in examples))


# ------------------------------------------------------------------------------------------------ the counts
def test_hop_counts_by_hand():
    # 48 x (0.5, 0.3, 0.2) = 24, 14.4, 9.6: floors 24, 14, 9, one left over to the largest remainder (hop 3, .6)
    assert kb.hop_counts(48, kb.hop_fractions({1: 0.5, 2: 0.3, 3: 0.2})) == {1: 24, 2: 14, 3: 10}
    # 10 x (0.45, 0.45, 0.1) = 4.5, 4.5, 1: one left over, remainders tie at .5 -> the fewer hops (hop 1)
    assert kb.hop_counts(10, kb.hop_fractions({1: 0.45, 2: 0.45, 3: 0.1})) == {1: 5, 2: 4, 3: 1}
    # 7 x (0.6, 0.4, 0) = 4.2, 2.8, 0: floors 4, 2, 0, one left over to hop 2 (.8); a zero share gets nothing
    assert kb.hop_counts(7, kb.hop_fractions({1: 0.6, 2: 0.4})) == {1: 4, 2: 3, 3: 0}
    # equal thirds: 100 -> 34, 33, 33 and 2 -> 1, 1, 0 (the first n % 3 hops one more)
    assert kb.hop_counts(100, kb.EQUAL_THIRDS) == {1: 34, 2: 33, 3: 33}
    assert kb.hop_counts(2, kb.EQUAL_THIRDS) == {1: 1, 2: 1, 3: 0}


def test_shares_are_read_as_written_and_renormalised():
    # 0.3 is exactly 3/10 (not the binary float just below it), so 0.3 of 10 questions is exactly 3
    assert kb.hop_fractions({1: 0.7, 2: 0.3}) == {1: Fraction(7, 10), 2: Fraction(3, 10), 3: Fraction(0)}
    assert kb.hop_counts(10, kb.hop_fractions({1: 0.7, 2: 0.3})) == {1: 7, 2: 3, 3: 0}
    # thirds written as decimals sum to 0.999999: within the tolerance, and split n as equal thirds do
    third = kb.hop_fractions({1: 0.333333, 2: 0.333333, 3: 0.333333})
    assert sum(third.values()) == 1
    assert all(kb.hop_counts(n, third) == kb.hop_counts(n, kb.EQUAL_THIRDS) for n in range(60))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.tuples(*(st.integers(0, 20) for _ in range(3))).filter(lambda w: sum(w) > 0))
def test_counts_sum_to_n_and_follow_the_shares_within_rounding(n, weights):
    fractions = kb.hop_fractions({h: w / sum(weights) for h, w in zip(kb.HOPS, weights, strict=True)})
    counts = kb.hop_counts(n, fractions)
    assert sum(counts.values()) == n
    for h in kb.HOPS:
        assert abs(counts[h] - n * fractions[h]) < 1  # largest remainder: never a whole question off
        if fractions[h] == 0:
            assert counts[h] == 0


@given(st.integers(0, 3000))
def test_equal_thirds_are_the_old_split(n):
    # the generator before the option
    old = {h: n // 3 + (1 if i < n % 3 else 0) for i, h in enumerate(kb.HOPS)}
    assert kb.hop_counts(n, kb.EQUAL_THIRDS) == old


# ------------------------------------------------------------------------------------------------ the generator
def test_the_default_mix_is_unchanged():
    assert kb.generate(48, 0, train_hop_fractions=None) == kb.generate(48, 0)
    assert kb.generate(48, 0, train_hop_fractions={1: 1 / 3, 2: 1 / 3, 3: 1 / 3}) == kb.generate(48, 0)
    assert _hops(kb.generate(48, 0)) == {1: 16, 2: 16, 3: 16}


def test_training_questions_follow_the_mix():
    examples = load_task("kb-multihop", "train", 48, seed=0, train_hop_fractions={1: 0.5, 2: 0.3, 3: 0.2})
    assert _hops(examples) == {1: 24, 2: 14, 3: 10}
    assert len({ex.question for ex in examples}) == 48
    assert _hops(kb.generate(30, 0, train_hop_fractions={1: 1.0})) == {1: 30}
    # a run's saved config, after a JSON round trip, has string keys: the same questions
    strings = kb.generate(48, 0, train_hop_fractions={"1": 0.5, "2": 0.3, "3": 0.2})
    assert strings == examples
    # more questions of a hop count than the region holds: the generator's clear error
    with pytest.raises(
        ValueError, match="has 648 1-hop questions, asked for 700 of 700; this hop mix fills at most 648"
    ):
        kb.generate(700, 0, train_hop_fractions={1: 1.0})


# ------------------------------------------------------------------------------------------- the default size
def test_most_questions_by_hand():
    # world 0's train region: 648 / 852 / 750 questions of 1 / 2 / 3 hops
    assert kb.available_questions(0, "train") == {1: 648, 2: 852, 3: 750}
    available = {1: 648, 2: 852, 3: 750}
    # 80/20: 1-hop binds, 648 / 0.8 = 810 exactly (810 -> 648 + 162); 811 would ask 649 (648.8 rounds up)
    assert kb.most_questions(available, kb.hop_fractions({1: 0.8, 2: 0.2}), 1500) == 810
    assert kb.hop_counts(811, kb.hop_fractions({1: 0.8, 2: 0.2}))[1] == 649
    # equal thirds fit 1500 (500 each) and any cap below it
    assert kb.most_questions(available, kb.EQUAL_THIRDS, 1500) == 1500
    assert kb.most_questions(available, kb.EQUAL_THIRDS, 7) == 7
    # all 2-hop: 852 of them
    assert kb.most_questions(available, kb.hop_fractions({2: 1.0}), 1500) == 852
    # a hop the mix needs has no questions: only n = 0 fits (n = 1 already asks for one 1-hop question)
    assert kb.most_questions({1: 0, 2: 5, 3: 5}, kb.hop_fractions({1: 0.5, 2: 0.5}), 10) == 0


@settings(max_examples=100, deadline=None)
@given(
    st.tuples(*(st.integers(0, 40) for _ in range(3))),
    st.tuples(*(st.integers(0, 9) for _ in range(3))).filter(lambda w: sum(w) > 0),
    st.integers(0, 120),
)
def test_most_questions_is_the_largest_fitting_n(counts, weights, cap):
    available = dict(zip(kb.HOPS, counts, strict=True))
    fractions = kb.hop_fractions({h: w / sum(weights) for h, w in zip(kb.HOPS, weights, strict=True)})

    def fits(n):
        return all(c <= available[h] for h, c in kb.hop_counts(n, fractions).items())

    most = kb.most_questions(available, fractions, cap)
    assert most <= cap and fits(most)
    assert not any(fits(n) for n in range(most + 1, cap + 1))  # brute force: nothing larger fits


def test_the_default_size_is_the_most_the_mix_fills():
    # regression (issue 32): with no task.limit the train split asked for 1500 x 0.8 = 1,200 1-hop questions and
    # raised, after the study's 80-minute precondition, at its first timed step
    examples = load_task("kb-multihop", "train", None, seed=0, train_hop_fractions={1: 0.8, 2: 0.2})
    assert _hops(examples) == {1: 648, 2: 162}
    assert len({ex.question for ex in examples}) == 810
    # without a mix, or on a held-out split, the sizes stay 1500 / 300 / 300
    assert len(load_task("kb-multihop", "train", None, seed=0)) == 1500
    assert kb.default_size("train", 0, train_hop_fractions={1: 1 / 3, 2: 1 / 3, 3: 1 / 3}) == 1500
    for split in ("test", "novel"):
        assert kb.default_size(split, 0, train_hop_fractions={1: 0.8, 2: 0.2}) == 300
    # a mix that fits 1500 keeps 1500
    assert kb.default_size("train", 0, train_hop_fractions={1: 0.4, 2: 0.3, 3: 0.3}) == 1500
    # an explicit limit the mix cannot fill is still the user's error, naming the most it fills
    with pytest.raises(ValueError, match="asked for 800 of 1000; this hop mix fills at most 810 questions"):
        load_task("kb-multihop", "train", 1000, seed=0, train_hop_fractions={1: 0.8, 2: 0.2})


@pytest.mark.parametrize("split", ["test", "novel"])
def test_held_out_splits_keep_equal_thirds(split):
    """A study draws its held-out sets with the study's task options: the training mix must not move them."""
    mixed = load_task("kb-multihop", split, 60, seed=0, train_hop_fractions={1: 0.8, 2: 0.2})
    assert mixed == load_task("kb-multihop", split, 60, seed=0)
    assert _hops(mixed) == {1: 20, 2: 20, 3: 20}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({1: 0.5, 2: 0.3}, "must sum to 1, got 0.8"),
        ({1: 1.5, 2: -0.5}, r"\[1\] must be a number in \[0, 1\], got 1.5"),
        ({1: 0.5, 4: 0.5}, r"keys must be hop counts \[1, 2, 3\], got 4"),
        ({1: True}, r"\[1\] must be a number"),
        ({1: "half", 2: 0.5}, r"\[1\] must be a number"),
        ([0.5, 0.3, 0.2], "must be a mapping of hop count to share"),
        ({}, "must be a mapping of hop count to share"),
    ],
)
def test_bad_values_name_the_option(value, says):
    with pytest.raises(ValueError, match=r"kb-multihop: task\.options\.train_hop_fractions.*" + says):
        kb.generate(10, 0, train_hop_fractions=value)
    # checked on every split, so a typo fails an evaluation too, not only training
    with pytest.raises(ValueError, match="train_hop_fractions"):
        kb.generate(10, 0, split="test", train_hop_fractions=value)


def test_a_bad_value_is_one_line_and_exit_2(tmp_path):
    from agentcredit.cli import app

    res = CliRunner().invoke(
        app,
        ["eval", "--model", "tiny", "-c", "grpo-kb-multihop", "--limit", "1", "--out", str(tmp_path / "e"),
         "--set", "task.options.train_hop_fractions={1: 0.5, 2: 0.3}"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert lines[-1] == (
        "error: kb-multihop: task.options.train_hop_fractions must sum to 1, got 0.8 ({1: 0.5, 2: 0.3})"
    )
    assert "Traceback" not in res.output


def test_a_study_with_an_easier_training_mix_keeps_its_fixed_held_out_sets(tmp_path):
    """The issue-32 study's held-out files (written before any run) regenerate byte for byte when the study's common
    settings add a training mix: the option cannot silently move a published held-out set."""
    from pathlib import Path

    import yaml

    from agentcredit.lab.study import Study, load_study

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "studies" / "kb-jsoncall-portool-regime.yaml").read_text())
    data["set"].append("task.options={train_hop_fractions: {1: 0.6, 2: 0.3, 3: 0.1}}")
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(data))
    study = Study(load_study(config), tmp_path / "out", log=lambda *_: None)
    assert study._task()[2] == {"train_hop_fractions": {1: 0.6, 2: 0.3, 3: 0.1}}
    study.dir.mkdir(parents=True)
    study._fix_heldout()
    published = root / "docs" / "results" / "kb-jsoncall-portool-regime" / "heldout"
    for name in ("test", "novel"):
        written = (study.dir / "heldout" / f"{name}.jsonl").read_text()
        assert written == (published / f"{name}.jsonl").read_text()


def test_a_study_checks_every_arms_training_questions_before_paying_for_its_start(tmp_path):
    """Regression (issue 32): an arm's training set the world cannot fill stops ``prepare`` with the arm's name,
    before the start's SFT and the precondition, not at the first timed step an hour later. The study's own
    arms, with their 80/20 mix and no task.limit, load (810 questions each)."""
    from pathlib import Path

    import yaml

    from agentcredit.lab.common import StudyError
    from agentcredit.lab.study import Study, load_study

    root = Path(__file__).resolve().parents[2]
    source = root / "studies" / "kb-jsoncall-portool-regime.yaml"
    Study(load_study(source), tmp_path / "ok", log=lambda *_: None).prepare(resume=False)
    data = yaml.safe_load(source.read_text())
    for arm in data["arms"]:  # alike in every arm, as the claims ask
        arm["set"] = [*arm["set"], "task.limit=1000"]
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(data))
    study = Study(load_study(config), tmp_path / "out", log=lambda *_: None)
    with pytest.raises(
        StudyError, match=r"arm 'grpo': kb-multihop: .* asked for 800 of 1000; .* at most 810"
    ):
        study.prepare(resume=False)
    assert not (study.dir / "start").exists()
