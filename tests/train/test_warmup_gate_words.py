"""The warm-up gate's statistics that cannot be computed say why and what to change, never "nan" (issue 54).

The sqlite-shop example stopped with "auc nan < 0.70": its 16 warm-up questions were all Tier 1 (no shop question
can be answered without the tool), so the AUC of V(s0) between tiers had one class. Each cause below is a count the
gate records beside its statistics (train/warmup.py ``_gate``); a warm-up on the tiny random model has all of them
at once.
"""

from __future__ import annotations

import math

import pytest
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.models.heads import BoundaryValueHead
from agentcredit.models.loading import load_base_model
from agentcredit.train.warmup import (
    GATE,
    MIN_GATE_QUESTIONS,
    WarmupSettings,
    gate_failures,
    undefined_causes,
    warmup,
    warmup_questions_needed,
)

NAN = float("nan")
COUNTS = {  # 16 warm-up questions, 3 held out, 12 held-out boundaries, 4 invokes, returns that differ
    "questions": 16.0,
    "tier2_questions": 0.0,
    "heldout_questions": 3.0,
    "heldout_tier2_questions": 0.0,
    "heldout_boundaries": 12.0,
    "heldout_invokes": 4.0,
    "heldout_return_mean": 0.5,
    "heldout_value_mean": 0.31,
    "heldout_value_sd": 0.08,
}


def gate(**values):
    return {"auc": 0.81, "sign_accuracy": 0.66, "explained_variance": 0.47, **COUNTS, **values}


def test_one_tier_names_the_cause_and_the_fix():
    (line,) = gate_failures(gate(auc=NAN))  # the example's case: every question needs the tool
    assert line.startswith(
        "auc undefined: all 16 warm-up questions were Tier 1 (none answered without the tool)"
    )
    assert "easier tier" in line and "nan" not in line
    (line,) = gate_failures(gate(auc=NAN, tier2_questions=16.0, heldout_tier2_questions=3.0))
    assert "all 16 warm-up questions were answered alone (Tier 2)" in line and "harder tier" in line
    # both tiers in the warm-up, one in its held-out share: more questions
    (line,) = gate_failures(gate(auc=NAN, tier2_questions=2.0))
    assert "its 3 held-out questions are all Tier 1 (2 of the 16 warm-up questions are Tier 2)" in line
    assert f"--questions; {warmup_questions_needed()} by default" in line


def test_no_tool_call_and_constant_returns_name_their_cause():
    sign, ev = gate_failures(gate(sign_accuracy=NAN, explained_variance=NAN, heldout_invokes=0.0))
    assert sign.startswith(
        "sign_accuracy undefined: no held-out rollout called a tool (3 held-out questions)"
    )
    assert ev.startswith("explained_variance undefined: every held-out rollout ended with R = 0.5")
    (ev,) = gate_failures(gate(explained_variance=NAN, heldout_boundaries=1.0))
    assert "fewer than 2 held-out boundary states" in ev


def test_a_constant_value_is_named():
    """Constant V leaves the statistics defined (AUC 0.5 by ties, every delta 0 counted wrong): the line says V."""
    lines = gate_failures(gate(auc=0.5, sign_accuracy=0.0, heldout_value_mean=0.5, heldout_value_sd=0.0))
    assert lines == [
        "auc 0.500 < 0.70",
        "sign_accuracy 0.000 < 0.60",
        "V is 0.500 at every held-out state: the value head did not learn (more --head-epochs)",
    ]
    assert undefined_causes(gate()) == {} and gate_failures(gate()) == []


def test_the_default_warmup_holds_out_the_gates_sample():
    """The default size is the one the gate's sample needs: 300 questions hold out 60 at 20% (A30's 5%: 1,200)."""
    assert warmup_questions_needed() == 300 == warmup_questions_needed(WarmupSettings.holdout_fraction)
    assert round(warmup_questions_needed() * WarmupSettings.holdout_fraction) == MIN_GATE_QUESTIONS
    assert warmup_questions_needed(0.05) == 1200
    import inspect

    from agentcredit.cli import warmup as cli_warmup

    # the command's default is None: run_warmup sizes it (agentcredit.run)
    assert inspect.signature(cli_warmup).parameters["questions"].default is None


def test_a_one_tier_warmup_on_the_tiny_model_reports_causes_not_nan():
    """A real warm-up whose questions are all Tier 1, whose V is constant and whose returns are all 0 (a random
    tiny model with no head epochs): its table and its gate failures explain every statistic in words."""
    model, tokenizer = load_base_model("tiny", seed=0)
    config = load_config("carl-segment-arith-tools", [*SMALL, "rollout.max_new_tokens=8"])
    lines: list[str] = []
    report = warmup(
        model,
        BoundaryValueHead(model.config.hidden_size),
        tokenizer,
        config,
        list(EXAMPLES),
        WarmupSettings(tier_samples=1, rollouts_per_mode=1, head_epochs=0, holdout_fraction=0.5),
        log=lines.append,
    )
    assert "tiers: 2 Tier 1, 0 Tier 2 (one tier only: the gate's AUC will be undefined)" in lines
    assert math.isnan(report.gate["auc"]) and not report.passed
    failures = gate_failures(report.gate)
    text = "\n".join([report.table(), *failures])
    assert "nan" not in text.lower(), text
    assert "auc undefined: all 2 warm-up questions were Tier 1" in text
    for name in GATE:
        assert any(line.startswith(name) for line in failures), (name, failures)
    assert any(line.startswith("V is ") for line in failures), failures  # the untrained head's constant V


@pytest.mark.parametrize("name", list(GATE))
def test_undefined_statistics_never_print_nan(name):
    for counts in ({}, COUNTS):
        assert "nan" not in " ".join(gate_failures({**counts, name: NAN})).lower()
