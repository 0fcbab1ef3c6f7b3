"""carl-segment's mechanism probe (issue 48): its statistics by hand (AUC of V(s_0), EV at every boundary, the
question-clustered bootstrap and its one-sided interval), its study file and its fresh questions."""

from __future__ import annotations

import math

import pytest

from agentcredit.lab.mechanism import load_spec
from agentcredit.lab.mechanism.carl_segment import (
    auc_margin,
    bootstrap_draws,
    bootstrap_interval,
    boundary_explained_variance,
    questions,
    regime,
    replicates,
    summarise,
)
from agentcredit.lab.mechanism.core import decide

STUDY = "studies/carl-segment-mechanism.yaml"


def _q(qid, tier, v_s0, episodes=(), **extra):
    return {
        "question": qid,
        "tier": tier,
        "source_tier": extra.pop("source_tier", "easy"),
        "v_s0": v_s0,
        "no_tool_correct": extra.pop("no_tool_correct", 1 if tier == "tier2" else 0),
        "no_tool_samples": 5,
        "optional": [{"values": list(v), "reward": r, "tool_calls": 0} for v, r in episodes]
        or [{"values": [v_s0], "reward": 1.0, "tool_calls": 0}],
        **extra,
    }


def test_auc_margin_by_hand():
    # Tier 2 (positive) 0.9, 0.6; Tier 1 0.6, 0.2: pairs 1 + 1 + 1/2 (the tie) + 1 = 3.5 of 4 -> AUC 0.875
    records = [_q("a", "tier2", 0.9), _q("b", "tier2", 0.6), _q("c", "tier1", 0.6), _q("d", "tier1", 0.2)]
    assert auc_margin(records) == pytest.approx(0.375)
    assert math.isnan(auc_margin(records[:2]))  # one tier only


def test_explained_variance_over_every_boundary_by_hand():
    # boundaries V = 0.5, 1.0 (return 1) and 0.5 (return 0): Var(R) = 2/9, Var(R - V) = Var(0.5, 0, -0.5) = 1/6
    records = [_q("a", "tier2", 0.5, [([0.5, 1.0], 1.0)]), _q("b", "tier1", 0.5, [([0.5], 0.0)])]
    assert boundary_explained_variance(records) == pytest.approx(1 - (1 / 6) / (2 / 9))  # 0.25


def test_the_bootstrap_resamples_questions_whole():
    records = [_q("a", "tier2", 0.5, [([0.5, 1.0], 1.0)]), _q("b", "tier1", 0.5, [([0.5], 0.0)])]
    # [0, 1] and [1, 0] are the sample itself (0.25); [0, 0] holds question a twice: its two boundaries move
    # together, every return is 1 and EV is undefined, so the replicate is dropped
    assert replicates(records, boundary_explained_variance, [[0, 1], [0, 0], [1, 0]]) == pytest.approx(
        [0.25, 0.25]
    )


def test_bootstrap_draws_keep_each_stratum_whole_and_its_size():
    strata = ["tier2", "tier1", "tier2", "tier1", "tier1"]
    draws = bootstrap_draws(strata, 50, seed=3)
    assert len(draws) == 50 and draws == bootstrap_draws(strata, 50, seed=3)
    for d in draws:
        assert sorted(strata[i] for i in d) == sorted(strata)  # 2 Tier 2 and 3 Tier 1 in every replicate
    assert len({tuple(d) for d in draws}) > 1


def test_bootstrap_interval_by_hand():
    reps = [0.3, -0.1, 0.2, 0.0, 0.1]  # sorted -0.1, 0, 0.1, 0.2, 0.3
    iv = bootstrap_interval(reps, 0.25)
    assert iv["low"] == pytest.approx(0.0) and iv["high"] == pytest.approx(0.2)  # order statistics 2 and 4
    assert iv["p_one_sided"] == pytest.approx(3 / 6)  # (1 + two replicates <= 0) / (5 + 1)
    assert iv["se"] == pytest.approx(math.sqrt(0.1 / 4))
    # between order statistics: linear interpolation (h = 4 x 0.1 = 0.4 -> -0.1 + 0.4 x 0.1)
    assert bootstrap_interval(reps, 0.1)["low"] == pytest.approx(-0.06)


def test_the_regime_numbers_by_hand():
    records = [
        _q("a", "tier2", 0.8, no_tool_correct=5, forced_correct=1, forced_samples=2, forced_tool_calls=2),
        _q("b", "tier2", 0.7, no_tool_correct=2, forced_correct=2, forced_samples=2, forced_tool_calls=2),
        _q("c", "tier1", 0.2, source_tier="hard", forced_correct=1, forced_samples=2, forced_tool_calls=1),
    ]
    r = regime(records)
    assert r["all"]["tier2_share"] == pytest.approx(2 / 3)
    # Tier 2: gaps 0.5 - 1.0 = -0.5 and 1.0 - 0.4 = +0.6 -> mean 0.05, se = sd(-0.5, 0.6) / sqrt(2) = 0.55
    assert r["tier2"]["tool_gap"] == pytest.approx(0.05) and r["tier2"]["tool_gap_se"] == pytest.approx(0.55)
    assert r["generator/hard"]["questions"] == 1 and r["generator/easy"]["tier2_share"] == 1.0
    # within the generator's easy tier there is one model tier only; overall 0.8, 0.7 above 0.2
    assert r["generator/easy"]["auc_margin"] is None and r["all"]["auc_margin"] == pytest.approx(0.5)


def test_the_study_file_loads_and_its_questions_are_fresh():
    from agentcredit.tasks import load_examples

    spec = load_spec(STUDY)
    assert spec.kind == "carl-segment" and [s.name for s in spec.statistics] == [
        "auc_margin",
        "explained_variance",
    ]
    auc = next(s for s in spec.statistics if s.name == "auc_margin")
    assert auc.effect == pytest.approx(0.35)  # the paper's 3B AUC 0.85 (l. 201) minus chance
    pilot, main = questions(spec, "pilot"), questions(spec, "main")
    assert len(pilot) == spec.pilot.count and len(main) == spec.main.count
    sft = {
        e.question for e in load_examples(spec.config(spec.sft_set), split="train", limit=spec.sft_examples)
    }
    warm = {
        e.question
        for e in load_examples(spec.config(spec.warmup.set), split="train", limit=spec.warmup.questions)
    }
    assert len(sft) == spec.sft_examples and len(warm) == spec.warmup.questions
    assert not any(e.question in sft | warm for e in pilot)
    assert not any(e.question in sft | warm | {p.question for p in pilot} for e in main)


def test_summarise_plans_and_decides():
    spec = load_spec(STUDY)
    # V(s_0) separates the tiers perfectly and V tracks the returns
    records = [_q(f"t2-{i}", "tier2", 0.8 + 0.01 * i, [([0.8, 0.9], 1.0)]) for i in range(6)] + [
        _q(f"t1-{i}", "tier1", 0.2 + 0.01 * i, [([0.2, 0.1], 0.0)]) for i in range(6)
    ]
    pilot = summarise(spec, records, "pilot")
    assert set(pilot["planning"]) == {"auc_margin", "explained_variance"}
    assert pilot["planning"]["auc_margin"]["mean"] == pytest.approx(0.5)
    # every resample separates the tiers perfectly: no spread, so this statistic plans nothing
    assert pilot["planning"]["auc_margin"]["se"] == 0 and pilot["planning"]["auc_margin"]["questions"] is None
    main = summarise(spec, records, "main")
    assert {v["verdict"] for v in main["statistics"].values()} == {"reproduced"}
    assert main["regime"]["all"]["tier2_share"] == pytest.approx(0.5)
    # V(s_0) unrelated to the tier: the interval holds 0 and not the paper's 0.35
    flat = [{**r, "v_s0": 0.5 + 0.01 * (i % 3)} for i, r in enumerate(records)]
    v = summarise(spec, flat, "main")["statistics"]["auc_margin"]
    assert v["low"] <= 0 and v["verdict"] == decide(v["low"], v["high"], spec.statistics[0])
    assert v["verdict"] in ("not reproduced", "effect excluded")


def test_a_start_that_is_not_the_excluded_sft_set_is_one_line(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from agentcredit.cli import app

    bad = tmp_path / "probe.yaml"
    bad.write_text(Path(STUDY).read_text().replace("sft_examples: 96", "sft_examples: 95"))
    result = CliRunner().invoke(app, ["probe", "--study", str(bad)])
    assert result.exit_code == 2 and "sft_examples" in result.output and "Traceback" not in result.output


def test_the_study_is_preregistered_from_its_pilot_and_ran_on_those_questions():
    """The planning SDs are registered, their plan fits the main part, and the committed records hold exactly the
    questions each part draws (the warm-up's and the SFT set's excluded)."""
    import json
    from pathlib import Path

    from agentcredit.lab.mechanism.core import planned_questions

    spec = load_spec(STUDY)
    assert spec.power >= 0.8 and all(s.planning_sd for s in spec.statistics)
    for s in spec.statistics:
        n, _ = planned_questions(s.effect, s.planning_sd, spec.pilot.count, spec.alpha / 2, spec.power)
        assert n <= spec.main.count, (s.name, n)
    for part in ("pilot", "main"):
        path = Path(f"docs/results/carl-segment-mechanism/{part}-records.jsonl")
        if part == "main" and not path.is_file():
            continue  # the main part not run yet
        ran = {json.loads(line)["question"] for line in path.open()}
        assert {e.id for e in questions(spec, part)} == ran, part
