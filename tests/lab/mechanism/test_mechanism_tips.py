"""TIPS's mechanism probe (issue 48): its statistics by hand, its turn classes, its study file and its questions."""

from __future__ import annotations

import pytest

from agentcredit.lab.mechanism import KINDS, load_spec
from agentcredit.lab.mechanism.core import planned_questions
from agentcredit.lab.mechanism.tips import (
    TipsProbe,
    episode_statistics,
    informative_turns,
    questions,
    turn_summary,
)

STUDY = "studies/tips-mechanism.yaml"


def test_episode_statistics_by_hand():
    # Phi(S_0..S_3) = -30, -31, -20, -19: Delta = -1, +11, +1; turns 2 and 3 informative (mean 6), turn 1 not (-1)
    s = episode_statistics([-30.0, -31.0, -20.0, -19.0], [False, True, True])
    assert s["deltas"] == pytest.approx([-1.0, 11.0, 1.0])
    assert s["delta_informative"] == pytest.approx(6.0) and s["delta_other"] == pytest.approx(-1.0)
    assert s["delta_gap"] == pytest.approx(7.0)
    # no other turn: the gap is undefined (None), the informative mean is not
    s = episode_statistics([-30.0, -29.5, -10.0], [True, True])
    assert s["delta_gap"] is None and s["delta_informative"] == pytest.approx(10.0)
    # no informative turn: both undefined
    s = episode_statistics([-30.0, -32.0], [False])
    assert (
        s["delta_gap"] is None and s["delta_informative"] is None and s["delta_other"] == pytest.approx(-2.0)
    )
    with pytest.raises(ValueError, match="M \\+ 1"):
        episode_statistics([-1.0, -2.0], [True, False])


def test_a_turn_is_informative_when_it_brings_a_new_gold_passage():
    gold = ["Ann Bo", "Cedar"]
    observations = [
        "Doc 1 (Title: Ann Bo) Ann Bo was born in Cedar. Doc 2 (Title: Dune) ...",  # new: Ann Bo
        "Doc 1 (Title: Dune) Dune mentions Cedar.",  # no gold passage (a name in the text is not its passage)
        "Doc 1 (Title: Cedar) Cedar is in Elm. Doc 2 (Title: Ann Bo) ...",  # new: Cedar
        "Doc 1 (Title: Cedar) again",  # redundant: Cedar's passage is in the context already
        "Doc 1 (Title: Ann Boleyn) a longer title is not Ann Bo's passage",
    ]
    assert informative_turns(observations, gold) == [True, False, True, False, False]


def test_turn_summary_by_hand():
    records = [
        {
            "deltas": [-1.0, 11.0, 1.0],
            "roles": ["distractor", "hop1", "hop2"],
            "informative": [False, True, False],
            "answer_in_results": [False, True, True],
        },
        {
            "deltas": [3.0, 5.0],
            "roles": ["hop1", "hop2"],
            "informative": [True, True],
            "answer_in_results": [False, True],
        },
    ]
    t = turn_summary(records)
    assert t["tool_turns"] == 5 and t["mean_abs_delta"] == pytest.approx(21.0 / 5)
    by = t["by_role"]
    assert by["hop1 informative, answer in results"] == {"turns": 1, "mean_delta": pytest.approx(11.0)}
    assert by["hop1 informative"] == {"turns": 1, "mean_delta": pytest.approx(3.0)}
    assert by["hop2 other, answer in results"] == {"turns": 1, "mean_delta": pytest.approx(1.0)}
    assert by["distractor other"]["mean_delta"] == pytest.approx(-1.0)


def test_the_study_file_is_the_tips_kind_and_preregistered():
    assert KINDS["tips"][1] == "TipsProbe"
    spec = load_spec(STUDY)
    assert isinstance(spec, TipsProbe) and spec.preset == "tips-kb-multihop"
    assert [s.name for s in spec.statistics] == ["delta_gap", "delta_informative"]
    assert spec.power >= 0.8
    # the main part's n covers each statistic's planned n (Bonferroni's first step: alpha / 2) once the pilot ran
    for s in spec.statistics:
        if s.planning_sd is not None:
            n, _ = planned_questions(s.effect, s.planning_sd, spec.pilot.count, spec.alpha / 2, spec.power)
            assert n <= spec.main.count, (s.name, n)


def test_the_potential_the_probe_reads_is_the_papers():
    # Phi scores the answer's tokens only, summed (Eqs. 15-16): the preset's settings, which the probe reads
    spec = load_spec(STUDY)
    config = spec.config()
    parts = config.algorithm.credit_method.settings_from(config.algorithm)
    tips = parts["tips"]
    assert tips.potential_scope == "answer_only" and tips.reduce == "sum"


def test_the_questions_are_two_hop_and_fresh():
    spec = load_spec(STUDY)
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert len(pilot) == spec.pilot.count and len(main) == spec.main.count
    assert all(e.info["hops"] == 2 for e in pilot + main)
    from agentcredit.tasks import load_task

    sft = {e.question for e in load_task("kb-multihop", split="train", limit=spec.sft_examples, seed=0)}
    assert not any(e.question in sft for e in pilot)
    used = sft | {e.question for e in pilot}
    assert not any(e.question in used for e in main)


def test_the_committed_records_are_the_parts_questions():
    """The committed records hold exactly the questions each part draws (the exclusions as they ran)."""
    import json
    from pathlib import Path

    spec = load_spec(STUDY)
    for part in ("pilot", "main"):
        path = Path(f"docs/results/tips-mechanism/{part}-records.jsonl")
        ran = {json.loads(line)["question"] for line in path.open()}
        assert {e.id for e in questions(spec, part)} == ran, part
