"""Mechanism probes (issue 48): their shared power plan and verdict rules, and GEAR's kind: its statistics by hand,
its questions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.lab.mechanism import load_spec
from agentcredit.lab.mechanism.core import (
    Statistic,
    holm,
    planned_questions,
    question_values,
    run_parts,
    summarise,
    verdict,
)
from agentcredit.lab.mechanism.gear import episode_statistics, questions

STUDY = "studies/gear-mechanism.yaml"


def test_episode_statistics_by_hand():
    # 6 tokens, turns 0 0 1 1 1 2; rKL positive mass 1 + 3 = 4 of which turn 1 holds 3; turn 1 holds 3 of 6 tokens
    turns = [0, 0, 1, 1, 1, 2]
    rkl = [1.0, -2.0, 3.0, 0.0, -1.0, 0.0]
    w = [0.9, 0.9, 1.1, 1.1, 0.95, 0.92]
    s = episode_statistics(turns, rkl, w, 1)
    assert s["rkl_share"] == pytest.approx(0.75) and s["token_share"] == pytest.approx(0.5)
    assert s["rkl_excess"] == pytest.approx(0.25)
    assert s["w_dev"] == pytest.approx(3.15 / 3) and s["w_other"] == pytest.approx(2.72 / 3)
    assert s["w_gap"] == pytest.approx((3.15 - 2.72) / 3)
    with pytest.raises(ValueError, match="some but not all"):
        episode_statistics([0, 0], [1.0, 1.0], [1.0, 1.0], 1)


def test_the_question_is_the_unit():
    records = [
        {"question": "b", "w_gap": 0.1},
        {"question": "a", "w_gap": 0.0},
        {"question": "b", "w_gap": 0.3},
    ]
    assert question_values(records, "w_gap") == pytest.approx([0.0, 0.2])
    # a record where the statistic is undefined (None) does not count
    assert question_values([*records, {"question": "c", "w_gap": None}], "w_gap") == pytest.approx([0.0, 0.2])


def test_planned_questions_match_the_normal_approximation_and_grow_with_the_pilot_sd_bound():
    # large-sample check: with the SD known (a huge pilot), n ~ ((z_.975 + z_.8) sd / effect)^2 + a small t correction
    n, sd_up = planned_questions(0.1, 0.2, 10_000, 0.025, 0.8)
    assert sd_up == pytest.approx(0.2, rel=0.02)
    assert ((1.959964 + 0.841621) * 2) ** 2 <= n <= ((1.959964 + 0.841621) * 2) ** 2 + 4
    # a small pilot plans with a larger SD: its upper 80% bound
    small, sd_small = planned_questions(0.1, 0.2, 5, 0.025, 0.8)
    assert sd_small > 0.2 and small > n


STAT = Statistic(name="w_gap", effect=0.02, effect_source="test", margin=0.005)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.03, 0.04, 0.05, 0.035, 0.045], "reproduced"),  # lower bound > 0
        ([0.001, -0.001, 0.0005, -0.0005, 0.0], "not reproduced"),  # upper bound < margin 0.005
        (
            [0.01, 0.0, 0.005, -0.005, 0.0, 0.01, 0.0, 0.005, -0.005, 0.0],
            "effect excluded",
        ),  # 0.005 <= high < .02
        ([0.05, -0.05, 0.02, -0.03], "underpowered"),  # the interval holds 0 and the effect
    ],
)
def test_verdict_rules(values, expected):
    v = verdict(values, STAT, 0.025, 0.8)
    assert v["verdict"] == expected, v
    assert ("questions_to_decide" in v) == (expected == "underpowered")


def test_holm_steps_down_and_stops():
    assert holm({"a": 0.001, "b": 0.03}, 0.05) == {"a": 0.025, "b": 0.05}
    # the first is not rejected: the second is tested at the level where the step-down stopped
    assert holm({"a": 0.04, "b": 0.3}, 0.05) == {"a": 0.025, "b": 0.025}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=30))
def test_verdict_interval_holds_the_mean_and_is_one_of_four(values):
    if len(set(values)) < 2:
        return
    v = verdict(values, STAT, 0.025, 0.8)
    assert v["low"] <= v["mean"] <= v["high"]
    assert v["verdict"] in ("reproduced", "not reproduced", "effect excluded", "underpowered")
    assert math.isclose(v["mean"], sum(values) / len(values), abs_tol=1e-12)


def test_the_study_file_is_preregistered_and_its_questions_are_fresh():
    spec = load_spec(STUDY)
    assert [s.name for s in spec.statistics] == ["rkl_excess", "w_gap"]
    assert spec.power >= 0.8 and all(s.planning_sd for s in spec.statistics)
    # the planned n from the registered planning SDs (Bonferroni's first step: alpha / 2) fits the main part
    for s in spec.statistics:
        n, _ = planned_questions(s.effect, s.planning_sd, spec.pilot.count, spec.alpha / 2, spec.power)
        assert n <= spec.main.count, (s.name, n)
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert len(main) == spec.main.count and all(e.info["hops"] == 2 for e in main)
    from agentcredit.tasks import load_task

    sft = {e.question for e in load_task("kb-multihop", split="train", limit=spec.sft_examples, seed=0)}
    used = sft | {e.question for e in pilot}
    assert not any(e.question in used for e in main)


def test_summarise_pilot_plans_and_main_decides():
    spec = load_spec(STUDY)
    records = [
        {"question": f"q{i}", "rkl_excess": 0.3 + 0.01 * (i % 3), "w_gap": 0.03 + 0.001 * (i % 4)}
        for i in range(8)
    ]
    pilot = summarise(spec, records, "pilot")
    assert set(pilot["planning"]) == {"rkl_excess", "w_gap"} and pilot["questions"] == 8
    main = summarise(spec, records, "main")
    assert {v["verdict"] for v in main["statistics"].values()} == {"reproduced"}


def test_a_part_resumes_past_records_of_no_question(tmp_path):
    """Regression: records without a question (PORTool's pilot keeps its sampled trees beside its questions) made a
    resumed part raise KeyError; the part resumes after the questions it holds."""
    from types import SimpleNamespace

    spec = load_spec(STUDY)
    asked = [SimpleNamespace(id=f"q{i}") for i in range(4)]
    (tmp_path / "pilot-records.jsonl").write_text(
        '{"sampled_tree": 1, "success": false}\n'
        + "".join(
            f'{{"question": "q{i}", "rkl_excess": {0.3 + 0.01 * i}, "w_gap": {0.03 + 0.002 * i}}}\n'
            for i in range(2)
        )
    )
    scored = []

    def score(ctx, spec, example):
        scored.append(example.id)
        i = int(example.id[1:])
        return [{"question": example.id, "rkl_excess": 0.3 + 0.01 * i, "w_gap": 0.03 + 0.002 * i}]

    summary = run_parts(
        spec,
        tmp_path,
        part="pilot",
        questions=lambda spec, part: asked,
        open_context=lambda spec: {},
        score_question=score,
        log=lambda _m: None,
    )
    assert scored == ["q2", "q3"] and summary["questions"] == 4 and summary["records"] == 5


def test_cli_bad_part_is_one_line():
    result = CliRunner().invoke(app, ["probe", "--study", STUDY, "--part", "both"])
    assert result.exit_code == 2 and "--part must be pilot or main" in result.output


def test_the_gear_pilot_is_the_one_that_ran():
    """The pilot's questions are the ones its committed records hold (none of them an SFT question, so excluding
    the SFT set from pilots left GEAR's pilot as it ran)."""
    import json

    spec = load_spec(STUDY)
    ran = {
        json.loads(line)["question"]
        for line in Path("docs/results/gear-mechanism/pilot-records.jsonl").open()
    }
    assert {e.id for e in questions(spec, "pilot")} == ran
    ran = {
        json.loads(line)["question"] for line in Path("docs/results/gear-mechanism/main-records.jsonl").open()
    }
    assert {e.id for e in questions(spec, "main")} == ran


def test_a_study_file_without_kind_or_with_a_wrong_field_is_one_line(tmp_path):
    bad = tmp_path / "probe.yaml"
    bad.write_text("name: x\n")
    result = CliRunner().invoke(app, ["probe", "--study", str(bad)])
    assert result.exit_code == 2 and "needs 'kind'" in result.output and "Traceback" not in result.output
    text = Path(STUDY).read_text().replace("name: gear-mechanism", "name: gear-mechanism\nsurprise: 1")
    bad.write_text(text)
    result = CliRunner().invoke(app, ["probe", "--study", str(bad)])
    assert result.exit_code == 2 and "surprise" in result.output
    bad.write_text(Path(STUDY).read_text().replace("name: w_gap", "name: nothing"))
    result = CliRunner().invoke(app, ["probe", "--study", str(bad)])
    assert result.exit_code == 2 and "statistics" in result.output
