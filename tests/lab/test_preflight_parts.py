"""The preflight's pure parts by hand: the carl-segment tool gap, the tree-success share, per-question values,
the power row of a claim and the one refusal message."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import yaml

from agentcredit.lab.preflight import (
    claim_effect,
    claim_power,
    group_breakdown,
    group_success_share,
    holds,
    per_question_values,
    refusal,
    regime_bound,
    tool_gap,
)
from agentcredit.lab.study import ClaimSpec, load_study


def test_tool_gap_by_hand():
    counts = {"a": 2, "b": 0, "c": 1}  # a, c: Tier 2 (>= 1 of the labelling samples right); b: Tier 1
    no_tool = {"a": 1.0, "b": 0.0, "c": 0.5}
    tool = {"a": 0.5, "b": 0.75, "c": 0.75}
    value, se, n = tool_gap(counts, no_tool, tool, "tier2")
    # differences 0.5 and -0.25: mean 0.125, sd 0.53033, se 0.375
    assert (value, n) == (pytest.approx(0.125), 2) and se == pytest.approx(0.375)
    value, se, n = tool_gap(counts, no_tool, tool, "tier1")
    assert (value, n) == (pytest.approx(-0.75), 1) and math.isnan(se)


def test_group_success_share_by_hand():
    assert group_success_share([True, True, False, False]) == (0.5, 0.25, 4)
    value, se, n = group_success_share([])
    assert math.isnan(value) and n == 0


def test_group_breakdown_by_hand():
    # per group: (hop count, correct trajectories, trajectories)
    groups = [(1, 3, 8), (1, 0, 8), (2, 1, 8), (3, 0, 8), (None, 8, 8)]
    out = group_breakdown(groups)
    keys = ("groups", "with_success", "correct", "trajectories", "share", "accuracy")
    assert out == {  # the group without a part is left out
        "1": dict(zip(keys, (2, 1, 3, 16, 0.5, 3 / 16), strict=True)),
        "2": dict(zip(keys, (1, 1, 1, 8, 1.0, 1 / 8), strict=True)),
        "3": dict(zip(keys, (1, 0, 0, 8, 0.0, 0.0), strict=True)),
    }
    assert group_breakdown([]) == {}


def test_holds():
    assert holds(0.1, ">=", 0.1) and not holds(0.1, ">", 0.1) and holds(-0.2, "<=", -0.1)
    assert not holds(math.nan, ">=", 0.0) and not holds(None, ">=", 0.0)


def rec(qid, correct, calls, tier="easy", hops=None):
    info = {"tier": tier} if hops is None else {"hops": hops}
    return {
        "id": qid,
        "correct": correct,
        "em": correct,
        "tool_calls": calls,
        "policy_tokens": 10,
        "info": info,
    }


def test_per_question_values_average_a_questions_episodes_and_pick_the_subset():
    rows = [rec("q1", 1, 0), rec("q1", 0, 2), rec("q2", 1, 1, tier="hard"), rec("q3", 0, 0)]
    assert per_question_values(rows, "accuracy") == [0.5, 1.0, 0.0]
    assert per_question_values(rows, "easy/tool_call_rate") == [0.5, 0.0]
    assert per_question_values(rows, "hard/tool_calls") == [1.0]
    counts = {"q1": 5, "q2": 0, "q3": 2}
    assert per_question_values(rows, "tier2/accuracy", counts) == [0.5, 0.0]
    assert per_question_values(rows, "tier2_strict/accuracy", counts, strict_at=5) == [0.5]
    assert per_question_values(rows, "tier1/accuracy", counts) == [1.0]
    hops = [rec("h1", 1, 3, hops=3), rec("h2", 0, 1, hops=1)]
    assert per_question_values(hops, "hop3/tool_calls") == [3.0]
    with pytest.raises(ValueError, match="no per-question value"):
        per_question_values(rows, "critic/ece")


def claim(**kw):
    return ClaimSpec(name="c", metric="accuracy", arm="a", baseline="b", **kw)


def test_the_effect_a_claim_is_judged_against():
    assert claim_effect(claim(direction="not_lower", margin=0.05)) == (0.05, "margin")
    lower = claim(direction="lower", paper_effect={"value": -0.44, "source": "Table 3"})
    assert claim_effect(lower) == (0.44, "paper")
    assert claim_effect(claim(direction="higher")) == (None, "none")


def test_claim_power_row_by_hand():
    lower = claim(direction="lower", paper_effect={"value": -0.2, "source": "T"})
    values = [1.0, 0.0] * 50  # sd = sqrt(0.25 * 100 / 99) = 0.502519
    row = claim_power(lower, values, 3)
    se = math.sqrt(2 * 0.25 * 100 / 99 / 100 / 3)
    assert row["mde"] == pytest.approx(5.6535 * se, rel=1e-4)  # exact noncentral t at 2 df: 0.2319 > 0.2
    assert row["underpowered"] is True and row["seeds_needed"] == 4 and row["effect_source"] == "T"
    assert row["seeds_range"] is None  # no pilot SD: a point plan
    # a study of 5 claims plans each at alpha 0.01 (Bonferroni): a larger MDE on the same data
    assert claim_power(lower, values, 3, 0.01)["mde"] > row["mde"]


def test_a_pilots_paired_sd_plans_the_claim_with_its_uncertainty():
    """Issue 49: the planning SD comes from a pilot of the compared arms (it holds the question noise: the start's
    per-question SD is not added again), and its 3 seeds make the seeds needed a range, not a point."""
    lower = claim(
        direction="lower",
        paper_effect={"value": -0.55, "source": "T"},
        power={"paired_sd": 0.135, "pilot_seeds": 3},
    )
    row = claim_power(lower, [1.0, 0.0] * 50, 3)
    assert row["mde"] == pytest.approx(0.4406, abs=1e-3)  # 5.653 x 0.135 / sqrt(3)
    assert row["underpowered"] is False and row["seeds_needed"] == 3
    few, point, many = row["seeds_range"]
    assert few == point == 3 and many > 10  # the SD's 95% interval reaches 6.3 x 0.135


def test_a_regime_passes_on_its_one_sided_bound():
    """Regression (issue 49): 0.771 with se 0.061 was "met" against 0.7; its one-sided 95% lower bound is 0.671."""
    assert regime_bound(0.771, 0.061, ">=") == pytest.approx(0.771 - 1.6449 * 0.061, abs=1e-4)
    assert not holds(regime_bound(0.771, 0.061, ">="), ">=", 0.7)
    assert holds(regime_bound(0.90, 0.061, ">="), ">=", 0.7)
    assert regime_bound(0.05, 0.02, "<=") == pytest.approx(0.05 + 1.6449 * 0.02, abs=1e-4)
    assert regime_bound(0.3, math.nan, ">=") == 0.3  # a gate's statistic without an se: its point value


def test_one_refusal_message_names_the_measured_values_unless_overridden():
    record = {
        "preconditions": [
            {"name": "gap", "value": 0.03, "se": 0.02, "n": 40, "op": ">=", "threshold": 0.1, "met": False},
            {"name": "ok", "value": 0.9, "se": 0.01, "n": 64, "op": ">=", "threshold": 0.5, "met": True},
        ],
        "power": [{"claim": "fewer", "mde": 0.3, "effect": 0.2, "effect_kind": "paper", "underpowered": True,
                   "seeds_needed": 7}],
        "overrides": {"regime": False, "power": False},
    }  # fmt: skip
    message = refusal(record)
    assert "gap: measured 0.030 (se 0.020, n=40, one-sided 95% bound –), needs >= 0.1" in message
    assert "ok" not in message
    assert "fewer: MDE 0.300 > paper 0.200 (seeds needed: 7)" in message
    assert refusal({**record, "overrides": {"regime": True, "power": True}}) is None


def test_the_new_fields_leave_the_published_studies_fingerprints_as_they_were():
    # an empty sft.set and the preconditions serialise as before they existed (a resume would refuse otherwise)
    for name, runs_too in (("kb-jsoncall-portool", True), ("kb-multihop-credit", False)):
        marker = yaml.safe_load(open(f"docs/results/{name}/study-as-run.yaml"))
        spec = load_study(f"studies/{name}.yaml")
        assert spec.start_fingerprint() == marker["start_fingerprint"]
        if runs_too:
            assert spec.runs_fingerprint() == marker["fingerprint"]


def test_the_two_rerun_studies_load_with_cited_preconditions_and_effects():
    for name in ("arith-tool-can-hurt", "kb-jsoncall-portool-regime"):
        spec = load_study(f"studies/{name}.yaml")
        assert spec.preregistered and all(p.source for p in spec.preconditions)
        assert all(c.paper_effect.source for c in spec.claims if c.direction == "lower")
        assert all(h.limit >= 150 for h in spec.heldout)
    assert load_study("studies/arith-tool-can-hurt.yaml").steps >= 60


def test_no_success_share_by_hand():
    from agentcredit.lab.study import no_success_share

    class Tree:
        def __init__(self, *outcomes):
            self._o = dict(enumerate(outcomes))

        def outcomes(self):
            return self._o

    # PORTool's -1 / 0 / +1 and EM's 0 / 1: a group counts as solved when one trajectory reaches 1
    assert no_success_share([Tree(-1, 0), Tree(1, -1), Tree(0, 0), Tree(1, 1)]) == 0.5
    assert math.isnan(no_success_share([]))


def test_the_sft_demonstrations_see_a_clean_tool_where_the_studys_tool_can_fail(tmp_path, monkeypatch):
    import agentcredit.run as run
    from agentcredit.lab.study import Study

    seen = {}

    def fake_sft(cfg, out_dir, **kw):
        seen["options"] = dict(cfg.task.options)

    monkeypatch.setattr(run, "run_sft", fake_sft)
    study = Study(load_study("studies/arith-tool-can-hurt.yaml"), tmp_path, log=lambda _: None)
    study.sft()
    assert seen["options"]["tool_failure_rate"] == 0.0  # start.sft.set
    common = load_study("studies/arith-tool-can-hurt.yaml").set[0]
    assert (
        "tool_failure_rate: 0.4" in common
    )  # the start's measurements and every arm: the tool that can hurt


def test_a_saved_measurement_is_keyed_by_the_settings_its_rollouts_read(tmp_path):
    # regression: the key held only the precondition and the weights, so after an arm's `set` changed its training
    # questions (kb-multihop's train_hop_fractions, same start) `--resume` reused the other questions' measurement
    from agentcredit.lab.preflight import _pre_digest
    from tests.lab.test_preflight import preregistered
    from tests.lab.test_study import write

    def keys(spec: dict) -> dict[str, str]:
        study = load_study(write(tmp_path / "s.yaml", spec))
        return {p.name: _pre_digest(p, "w", study) for p in study.preconditions}

    base = keys(preregistered())
    mixed = preregistered()
    for arm in mixed["arms"]:  # the measured arm of "trees hold a success" is grpo (the arms must stay alike)
        arm["set"] = ["rollout.n=3"]
    changed = keys(mixed)
    assert changed["trees hold a success"] != base["trees hold a success"]
    assert changed["tier 2 better without the tool"] == base["tier 2 better without the tool"]  # reads no arm
    assert all(keys(preregistered(seeds=[5, 1]))[name] != key for name, key in base.items())
    assert keys(preregistered()) == base  # the same file, the same keys


def test_the_precondition_never_measures_a_question_sft_saw(monkeypatch):
    """Regression (issue 49): the precondition took the first N training questions, which the start's SFT had
    demonstrated (39 of the PORTool regime's 48); it now skips every question SFT saw, by text."""
    from types import SimpleNamespace

    from agentcredit.lab.common import StudyError
    from agentcredit.lab.preflight import _training_examples

    pool = [SimpleNamespace(id=f"q{i}", question=f"Q{i}") for i in range(10)]
    monkeypatch.setattr(
        "agentcredit.tasks.load_examples", lambda cfg, split="train", limit=None: pool[:limit]
    )
    cfg = SimpleNamespace(task=SimpleNamespace(split="train"))
    got = _training_examples(cfg, 4, frozenset({"Q0", "Q2"}))
    assert [e.id for e in got] == ["q1", "q3", "q4", "q5"]
    with pytest.raises(StudyError, match="never saw"):
        _training_examples(cfg, 9, frozenset({"Q0", "Q2"}))


def test_the_portool_regime_study_measures_questions_outside_its_sft():
    """The real study: its precondition's questions and its start's SFT demonstrations do not meet."""
    from agentcredit.lab.arms import study_config
    from agentcredit.lab.preflight import _training_examples, sft_questions

    spec = load_study("studies/kb-jsoncall-portool-regime.yaml")
    pre = spec.preconditions[0]
    arm = next(a for a in spec.arms if a.name == pre.arm)
    cfg = study_config(arm.preset, [*spec.set, *arm.set], arm.name)
    sft = sft_questions(spec)
    assert len(sft) == spec.start.sft.examples
    measured = _training_examples(cfg, pre.questions, sft)
    assert len(measured) == pre.questions and not {e.question for e in measured} & sft


def test_a_claim_is_planned_on_the_smaller_of_the_papers_effect_and_its_equivalence_margin():
    """kb-jsoncall-portool-regime: the paper's effect is 1.19 calls, the margin 0.55: a verdict either way
    (reproduced, or the effect excluded) needs power at 0.55; a margin at or above the paper's effect leaves it."""
    from agentcredit.lab.preflight import claim_effect

    c = SimpleNamespace(
        direction="lower", margin=0.0, equivalence_margin=0.55, paper_effect=SimpleNamespace(value=-1.19)
    )
    assert claim_effect(c) == (0.55, "equivalence margin")
    c.equivalence_margin = 1.19
    assert claim_effect(c) == (1.19, "paper")
    c.equivalence_margin = None
    assert claim_effect(c) == (1.19, "paper")


def test_the_warmup_gate_is_logged_as_read_from_its_record_not_measured_on_training_questions():
    """Regression: every precondition's line said "measuring ... on 48 training questions", the gate's too, which
    rolls out nothing (it reads the warm-up's gate record)."""
    from agentcredit.lab.preflight import measuring_line
    from agentcredit.lab.study_spec import PreconditionSpec

    gate = PreconditionSpec(
        name="critic EV", source="l. 391", measure="warmup_gate", metric="explained_variance", threshold=0.45
    )
    trees = PreconditionSpec(name="trees", source="l. 1", measure="group_success", arm="grpo", threshold=0.7)
    assert (
        measuring_line(gate) == "[preflight] measuring 'critic EV': reading the critic warm-up's gate record"
    )
    assert measuring_line(trees) == "[preflight] measuring 'trees' on 48 training questions"
