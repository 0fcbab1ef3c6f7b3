"""TIPS's potential terms from a teacher's scores, by hand: the answer's token span, Phi over aliases and its split.

:func:`tips_potential_terms` only asks its ``score`` for log-probs of continuations after contexts, so a fake
scorer that gives every token -0.5 makes each number hand-checkable (the trainer's own scorer is
``tests/train/test_tips_potential_scope.py``'s).
"""

from __future__ import annotations

import math

import pytest

from agentcredit.credit.methods.tips import (
    TipsPotentials,
    answer_token_span,
    signal_stats,
    tips_potential_terms,
    tips_split_metrics,
)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def merging(text: str) -> list[int]:
    """A tokeniser that merges ">3" into one token (as BPE may merge a tag's end with the answer's start)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(">3", i):
            out.append(1000)
            i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_answer_token_span_hand_worked():
    ids, start, end = answer_token_span(chars, "<answer>391</answer>", "391")
    assert (len(ids), start, end) == (20, 8, 11)  # "<answer>" 8 format tokens, "391", "</answer>" 9
    ids, start, end = answer_token_span(merging, "<answer>391</answer>", "391")
    assert ids[7] == 1000 and (start, end) == (7, 10)  # the merged ">3" counts as answer
    ids, start, end = answer_token_span(chars, "\\boxed{7}", "7")
    assert (start, end) == (7, 8)
    assert answer_token_span(chars, "forty-two", "42")[1:] == (0, 9)  # not verbatim: all answer


class Half:
    """Every continuation token gets log-prob -0.5; records what it was asked."""

    def __init__(self):
        self.asked: list[tuple[list[int], list[int]]] = []

    def __call__(self, contexts, continuations):
        self.asked += [(list(c), list(x)) for c, x in zip(contexts, continuations, strict=True)]
        return [[-0.5] * len(x) for x in continuations]


def render(answer: str) -> str:
    return f"[{answer}]"


def test_answer_only_forces_the_tag_and_scores_the_answer():
    score = Half()
    # one trajectory, two policy segments; "ab" twice and an empty alias: one alias after de-duplication
    out = tips_potential_terms(score, [[[1, 2], [1, 2, 3]]], [["ab", "ab", ""]], chars, render)
    # "[ab]" -> "[" is format (forced into the context), "ab" scored: 2 tokens x -0.5 = -1.0
    assert score.asked == [([1, 2, ord("[")], chars("ab")), ([1, 2, 3, ord("[")], chars("ab"))]
    assert out == TipsPotentials([[-1.0, -1.0]], [[0.0, 0.0]], [[-1.0, -1.0]], "answer_only")


def test_full_scores_every_token_and_splits_it():
    score = Half()
    out = tips_potential_terms(score, [[[7]]], [["ab"]], chars, render, scope="full")
    assert score.asked == [([7], chars("[ab]"))]
    # 4 tokens x -0.5 = -2.0: "[" and "]" the format part (-1.0), "ab" the answer part (-1.0)
    assert out.potentials == [[-2.0]] and out.format == [[-1.0]] and out.answer == [[-1.0]]
    mean = tips_potential_terms(Half(), [[[7]]], [["ab"]], chars, render, scope="full", reduce="mean")
    assert mean.potentials == [[-0.5]]  # the released code's length-normalised score


def test_aliases_combine_by_logsumexp_and_the_split_averages_them():
    out = tips_potential_terms(Half(), [[[7]]], [["ab", "c"]], chars, render)
    # "ab": -1.0, "c": -0.5; Phi = log(e^-1 + e^-0.5); the answer part is the aliases' mean
    assert out.potentials[0][0] == pytest.approx(math.log(math.exp(-1.0) + math.exp(-0.5)))
    assert out.answer == [[-0.75]] and out.format == [[0.0]]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="potential_scope"):
        tips_potential_terms(Half(), [[[7]]], [["ab"]], chars, render, scope="tags")
    with pytest.raises(ValueError, match="1 answer lists for 2 trajectories"):
        tips_potential_terms(Half(), [[[7]], [[8]]], [["ab"]], chars, render)
    with pytest.raises(ValueError, match="trajectory 0 has no gold answer"):
        tips_potential_terms(Half(), [[[7]]], [["", ""]], chars, render)


def test_split_metrics_and_the_step_log():
    split = TipsPotentials([[-3.0, -1.0], [-2.0]], [[-1.0, 0.0], [-0.5]], [[-2.0, -1.0], [-1.5]], "full")
    m = tips_split_metrics(split)
    # at S_0: means over the two trajectories; over every state: over the three
    assert m["tips/phi_0_format"] == pytest.approx(-0.75) and m["tips/phi_0_answer"] == pytest.approx(-1.75)
    assert m["tips/phi_format"] == pytest.approx(-0.5) and m["tips/phi_answer"] == pytest.approx(-1.5)
    assert m["tips/answer_only"] == 0.0

    class Signals(dict):
        details = {"potential_split": split}

    logged = signal_stats(None, Signals(alpha=0.25))
    assert logged == {"tips/alpha": 0.25, **m}
    assert signal_stats(None, type("S", (dict,), {"details": {}})(alpha=None)) == {}
