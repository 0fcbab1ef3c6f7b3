"""carl-critical's mechanism probe (issue 48): its statistic by hand (Eq. 5's SD, the AUC, the bootstrap that
resamples questions), its study file and its questions."""

from __future__ import annotations

import math

import pytest

from agentcredit.lab.mechanism import load_spec
from agentcredit.lab.mechanism.carl_critical import (
    auc,
    cluster_bootstrap_auc,
    population_sd,
    questions,
    summarise,
)
from agentcredit.lab.mechanism.core import format_summary, planned_questions

STUDY = "studies/carl-critical-mechanism.yaml"


def test_population_sd_is_eq5s_std_of_the_draws():
    assert population_sd([0.0, 0.0, 1.0, 1.0]) == pytest.approx(0.5)
    # one success in four: mean 0.25, variance (3 x 0.0625 + 0.5625) / 4 = 0.1875 -> 0.433 (above the paper's 0.4)
    assert population_sd([0.0, 0.0, 0.0, 1.0]) == pytest.approx(math.sqrt(0.1875))
    assert population_sd([1.0, 1.0, 1.0]) == 0.0


def test_auc_by_hand():
    # pairs (high, low): (2,1) win, (2,2) tie, (3,1) win, (3,2) win -> 3.5 / 4
    assert auc([2.0, 3.0], [1.0, 2.0]) == pytest.approx(0.875)
    assert auc([1.0], [2.0]) == 0.0 and auc([1.0], [1.0]) == 0.5
    with pytest.raises(ValueError, match="both groups"):
        auc([], [1.0])


def test_the_bootstrap_resamples_questions():
    # every question separates perfectly: every resample with both groups has AUC 1, so the interval is [1, 1]
    perfect = [[(2.0, True), (1.0, False)], [(3.0, True), (0.5, False)], [(1.5, True), (1.2, False)]]
    b = cluster_bootstrap_auc(perfect, resamples=200, alpha=0.05, seed=1)
    assert b["auc"] == 1.0 and b["low"] == b["high"] == 1.0 and b["se"] == 0.0 and b["dropped"] == 0
    # one question holds the only high state, the other the only low one: a resample has both with probability 1/2;
    # the others are dropped, and each kept one is the whole sample's AUC (1: entropy 2 > 1)
    split = [[(2.0, True)], [(1.0, False)]]
    b = cluster_bootstrap_auc(split, resamples=400, alpha=0.05, seed=0)
    assert b["auc"] == 1.0 and b["resamples"] + b["dropped"] == 400
    assert 150 < b["dropped"] < 250
    # states move together with their question: a question's states are never split across resamples
    mixed = [[(1.0, True), (1.0, False)], [(5.0, True), (0.0, False)]]
    b = cluster_bootstrap_auc(mixed, resamples=300, alpha=0.1, seed=2)
    # possible resamples: {q0,q0} -> 0.5, {q1,q1} -> 1.0, {q0,q1} -> pairs (1,1) tie, (1,0) win, (5,1) win, (5,0) win
    assert b["auc"] == pytest.approx(3.5 / 4)
    assert b["low"] >= 0.5 - 1e-12 and b["high"] <= 1.0 and b["low"] < b["auc"] < b["high"]
    # the one-sided p is the share of resamples at or below 0.5: the {q0, q0} ones, about a quarter
    assert 0.15 < b["p_one_sided"] < 0.35


def _records(groups):
    return [
        {"question": q, "entropy": h, "high": hi, "reward_mean": 0.5}
        for q, states in groups.items()
        for h, hi in states
    ]


def test_summarise_plans_from_the_bootstrap_se_and_decides_on_auc_minus_half():
    spec = load_spec(STUDY)
    groups = {f"q{i}": [(1.0 + i % 3, True), (0.5 + (i * 7) % 5 / 4, False)] for i in range(12)}
    pilot = summarise(spec, _records(groups), "pilot")
    plan = pilot["planning"]["auc_entropy"]
    assert plan["sd"] == pytest.approx(plan["bootstrap_se"] * math.sqrt(12))
    stat = spec.statistics[0]
    assert plan["questions"] == planned_questions(stat.effect, plan["sd"], 12, spec.alpha, spec.power)[0]
    main_summary = summarise(spec, _records(groups), "main")
    # the command prints both parts' summaries with core's format
    assert "auc_entropy" in format_summary(pilot) and "auc_entropy" in format_summary(main_summary)
    main = main_summary["statistics"]["auc_entropy"]
    assert main["mean"] == pytest.approx(main["auc"] - 0.5) and 0.0 <= main["p_one_sided"] <= 1.0
    assert main["verdict"] == ("reproduced" if main["low"] > 0 else main["verdict"])
    # no separation at all: every high state's entropy equals a low one's -> AUC 0.5, interval around 0
    flat = {f"q{i}": [(1.0, True), (1.0, False)] for i in range(12)}
    v = summarise(spec, _records(flat), "main")["statistics"]["auc_entropy"]
    assert v["auc"] == 0.5 and v["low"] == v["high"] == 0.0 and v["verdict"] == "not reproduced"


def test_the_study_file_loads_and_its_questions_are_fresh():
    spec = load_spec(STUDY)
    assert spec.kind == "carl-critical" and [s.name for s in spec.statistics] == ["auc_entropy"]
    assert spec.power >= 0.8 and spec.statistics[0].planning_sd
    # the main part's n is the plan from the registered planning SD
    stat = spec.statistics[0]
    n, _ = planned_questions(stat.effect, stat.planning_sd, spec.pilot.count, spec.alpha, spec.power)
    assert n <= spec.main.count
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert len(pilot) == spec.pilot.count and len(main) == spec.main.count
    from agentcredit.tasks import load_examples

    sft = {e.question for e in load_examples(spec.config(), split="train", limit=spec.sft_examples)}
    assert not any(e.question in sft for e in pilot)
    used = sft | {e.question for e in pilot}
    assert not any(e.question in used for e in main)


def test_a_wrong_field_is_one_line(tmp_path):
    bad = tmp_path / "s.yaml"
    text = open(STUDY).read().replace("continuations:", "continuation:")
    bad.write_text(text)
    with pytest.raises(ValueError, match="continuation") as caught:
        load_spec(bad)
    assert "\n" not in str(caught.value)
