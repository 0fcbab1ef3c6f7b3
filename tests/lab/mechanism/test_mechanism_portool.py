"""PORTool's mechanism probe (issue 48): its statistics by hand, Eq. 2 on the probe's fork shapes by hand, the
study file, its questions, and one question's trees through the repo's pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcredit.credit import portool_advantage_terms
from agentcredit.lab.mechanism import load_spec
from agentcredit.lab.mechanism.core import planned_questions
from agentcredit.lab.mechanism.portool import fork_statistics, questions, summarise

STUDY = "studies/portool-mechanism.yaml"
RESULTS = Path("docs/results/portool-mechanism")


def test_fork_statistics_by_hand():
    # a clean fork: at 0.95 the answer step 1.25, the search step 0.95 + 0.25 = 1.20; at 1 both 1.25 (a tie)
    s = fork_statistics(
        {"gamma": (1.25, 1.20), "control": (1.25, 1.25)},
        {"gamma": (2.0, -2.5), "control": (0.0, 0.0)},
    )
    assert (s["answer_first_gamma"], s["answer_first_control"], s["rank_gain"]) == (1, 0, 1)
    assert s["reward_gap_gamma"] == pytest.approx(0.05) and s["reward_gap_control"] == 0.0
    assert s["push_gamma"] == pytest.approx(4.5) and s["push_gain"] == pytest.approx(4.5)
    # a mixed fork: gamma = 1 already ranks the answer first (avg over +1 and -1 under the search): no gain
    s = fork_statistics(
        {"gamma": (1.25, 1.20), "control": (1.25, 0.25)},
        {"gamma": (2.3, -1.3), "control": (2.3, -1.3)},
    )
    assert (s["answer_first_gamma"], s["answer_first_control"], s["rank_gain"]) == (1, 1, 0)
    assert s["push_gain"] == pytest.approx(0.0)
    # a gap inside the G rule's tie tolerance ranks neither first; the search first counts -1
    s = fork_statistics(
        {"gamma": (1.0, 1.0 - 1e-7), "control": (0.9, 1.0)}, {"gamma": (0, 0), "control": (0, 0)}
    )
    assert (s["answer_first_gamma"], s["search_first_control"], s["rank_gain"]) == (0, 1, 0)


def test_eq2_on_the_probe_shapes_by_hand():
    """The premise, on the repo's function: node 1 = tau*'s search, 2 = answer now, 3 = one more search, then
    4 = answer right (and, mixed, 5 = answer wrong); every step R_fm 0.25."""
    clean = dict(
        parents=[-1, 0, 1, 1, 3], step_lengths=[0, 10, 10, 10, 10], format_rewards=[0.0] + [0.25] * 4
    )
    at = portool_advantage_terms(**clean, leaf_outcomes={2: 1.0, 4: 1.0}, gamma=0.95)
    assert at.step_rewards[2] == pytest.approx(1.25) and at.step_rewards[3] == pytest.approx(0.95 + 0.25)
    assert at.aggregation[1] == "max" and at.fork_advantages[2] == pytest.approx(0.7071, abs=1e-4)
    at1 = portool_advantage_terms(**clean, leaf_outcomes={2: 1.0, 4: 1.0}, gamma=1.0)
    assert at1.step_rewards[2] == at1.step_rewards[3] == pytest.approx(1.25)  # tie: avg, no fork signal
    assert at1.aggregation[1] == "avg" and at1.fork_advantages[2] == 0.0
    mixed = dict(parents=[-1, 0, 1, 1, 3, 3], step_lengths=[0] + [10] * 5, format_rewards=[0.0] + [0.25] * 5)
    at1 = portool_advantage_terms(**mixed, leaf_outcomes={2: 1.0, 4: 1.0, 5: -1.0}, gamma=1.0)
    # maxima tie (1.25 and 1.25): avg, so the search step gets (1 - 1) / 2 + 0.25 = 0.25
    assert at1.aggregation[1] == "avg" and at1.step_rewards[3] == pytest.approx(0.25)
    assert at1.fork_advantages[2] == pytest.approx(0.7071, abs=1e-4)  # the same z-score as at 0.95


def test_a_pilot_statistic_without_spread_plans_no_questions_and_does_not_crash():
    spec = load_spec(STUDY)
    records = [{"question": f"q{i}", "rank_gain": 0.5, "push_gain": 2.0 + 0.1 * (i % 3)} for i in range(6)]
    records.append(
        {"sampled": "q0", "holds_success": False}
    )  # a sampled tree's record: no statistic reads it
    pilot = summarise(spec, records, "pilot")
    assert pilot["questions"] == 6 and pilot["records"] == 6
    assert pilot["planning"]["rank_gain"]["sd"] == 0.0 and "note" in pilot["planning"]["rank_gain"]
    assert pilot["planning"]["push_gain"]["sd"] > 0
    main = summarise(spec, records, "main")
    assert main["statistics"]["rank_gain"]["verdict"] == "reproduced"  # a point interval at 0.5 > 0


def test_the_study_file_loads_and_its_questions_are_fresh():
    spec = load_spec(STUDY)
    assert spec.kind == "portool" and [s.name for s in spec.statistics] == ["rank_gain", "push_gain"]
    assert spec.power >= 0.8 and spec.gamma_control == 1.0
    assert (
        spec.config().algorithm.portool.gamma == 0.95
    )  # the preset's: the paper's best (portool.txt l. 674)
    for s in spec.statistics:
        if s.planning_sd:
            n, _ = planned_questions(s.effect, s.planning_sd, spec.pilot.count, spec.alpha / 2, spec.power)
            assert n <= spec.main.count, (s.name, n)
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert len(pilot) == spec.pilot.count and len(main) == spec.main.count
    from agentcredit.tasks import load_task

    sft = {e.question for e in load_task("kb-multihop", split="train", limit=spec.sft_examples, seed=0)}
    assert not any(e.question in sft for e in pilot)
    assert not any(e.question in sft | {p.question for p in pilot} for e in main)


def test_one_question_through_the_pipeline():
    """Real replay, real knowledge_search, the preset's judge and the repo's PORTool estimate: the clean fork is
    ranked by the decay alone, the mixed one by gamma = 1 too, the failing one the other way."""
    from agentcredit.lab.mechanism.portool import open_context, score_question

    spec = load_spec(STUDY).model_copy(update={"sampled_questions": 0})
    example = questions(spec, "pilot")[0]
    ctx = open_context(spec)
    try:
        records = {r["fork"]: r for r in score_question(ctx, spec, example)}
    finally:
        ctx["env"].close()
    clean, mixed, failing = records["clean"], records["mixed"], records["failing"]
    assert clean["outcomes"] == [1.0, 1.0] and mixed["outcomes"] == [-1.0, 1.0, 1.0]
    assert failing["outcomes"] == [-1.0, -1.0]
    assert clean["format_answer"] == clean["format_search"] == 0.25  # real steps, full rubric
    assert clean["reward_gap_gamma"] == pytest.approx(0.05) and clean["rank_gain"] == 1
    assert clean["advantage_answer_control"] == 0.0 and clean["push_gain"] > 0
    assert mixed["rank_gain"] == 0 and mixed["push_gain"] == pytest.approx(0.0, abs=1e-3)
    assert failing["search_first_gamma"] == 1 and failing["rank_gain"] is None


def test_only_the_pilot_samples():
    """The sampled questions are the pilot's first, known by text: ids restart with every draw, so the main
    part's first ids are the pilot's (a run that matched ids sampled main questions)."""
    from agentcredit.lab.mechanism.portool import open_context

    spec = load_spec(STUDY)
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert pilot[0].id == main[0].id and pilot[0].question != main[0].question
    ctx = open_context(spec)
    ctx["env"].close()
    assert ctx["sample_questions"] == {e.question for e in pilot[: spec.sampled_questions]}
    assert not ctx["sample_questions"] & {e.question for e in main}


@pytest.mark.skipif(not (RESULTS / "main-records.jsonl").is_file(), reason="the main part has not run")
def test_the_committed_records_are_the_study_questions():
    spec = load_spec(STUDY)
    for part in ("pilot", "main"):
        ran = {
            json.loads(line)["question"]
            for line in (RESULTS / f"{part}-records.jsonl").open()
            if "question" in json.loads(line)
        }
        assert {e.id for e in questions(spec, part)} == ran, part
