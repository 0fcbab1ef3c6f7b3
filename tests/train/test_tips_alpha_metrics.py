"""TIPS alpha follows the spec/paper rule, and every step logs the potentials' scale (issue 11, item 3.1).

Summed answer log-probs are tens of nats on a small model, so a fixed alpha = 0.2 makes the terminal correction
-alpha Phi(S_M) several times the outcome reward. The paper (§4.3, App. D) picks alpha so that the mean
|alpha dPhi| is about 0.2; tips.md §3.7/§8 item 7 recommends the per-batch ``batch_target`` control. The spec's
default target is the released code's 0.11; where spec and paper disagree the paper wins, so the presets target
0.2 (the paper's E|alpha dPhi| ~ 0.2), checked below.
"""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.credit import tips_batch_alpha
from agentcredit.credit.methods.tips import tips_stats
from agentcredit.models.loading import load_base_model
from agentcredit.train.trainer import Trainer

TIPS_PRESETS = ["tips-arith-tools", "tips-gsm8k", "tips-hotpotqa", "tips-kb-multihop"]


@pytest.mark.parametrize("preset", TIPS_PRESETS)
def test_tips_presets_use_the_batch_target_alpha_of_the_paper(preset):
    t = load_config(preset).algorithm.tips
    assert t.alpha_mode == "batch_target"
    # paper §4.3 / App. D: E|alpha dPhi| ~ 0.2 (the spec's default 0.11 is the released code's; the paper wins)
    assert t.target_mean_abs == pytest.approx(0.2)
    # fallback until a batch has a tool turn: the code's delta_phi_scale (0.02), not 0.2 x tens of nats
    assert t.alpha <= 0.02


def test_batch_target_alpha_hits_the_paper_target():
    deltas = [-12.0, 3.0, 0.0, 25.0]
    alpha = tips_batch_alpha(
        deltas, target_mean_abs=load_config("tips-arith-tools").algorithm.tips.target_mean_abs
    )
    nonzero = [abs(d) for d in deltas if d]
    assert math.fsum(alpha * d for d in nonzero) / len(nonzero) == pytest.approx(0.2, abs=1e-9)


def test_tips_stats_hand_worked():
    potentials = [[-30.0, -20.0, -26.0], [-40.0]]  # one episode with two tool turns, one with none
    stats = tips_stats(potentials, alpha=0.05)
    assert stats["tips/phi_0"] == pytest.approx(-35.0)
    assert stats["tips/phi_last"] == pytest.approx(-33.0)  # Phi(S_M): -26 and (M = 0) -40
    assert stats["tips/mean_abs_dphi"] == pytest.approx(8.0)  # |+10|, |-6|
    assert stats["tips/dphi_count"] == 2.0
    assert stats["tips/mean_abs_shaping"] == pytest.approx(0.4)  # alpha * mean |dPhi|
    assert stats["tips/terminal_correction"] == pytest.approx(0.05 * 33.0)  # mean of -alpha Phi(S_M)
    empty = tips_stats([[-5.0]], alpha=0.1)
    assert empty["tips/mean_abs_dphi"] == 0.0 and empty["tips/dphi_count"] == 0.0
    assert all(math.isfinite(v) for v in empty.values())


def test_one_tiny_tips_step_logs_potential_scale():
    torch.manual_seed(0)
    model, tokenizer = load_base_model("tiny", seed=0)
    config = load_config("tips-arith-tools", [*SMALL, "rollout.n=2", "rollout.max_new_tokens=24"])
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        metrics = trainer.train_step().metrics
    finally:
        trainer.close()
    for key in (
        "tips/mean_abs_dphi",
        "tips/phi_last",
        "tips/phi_0",
        "tips/alpha",
        "tips/terminal_correction",
    ):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["tips/phi_last"] < 0  # a summed log-prob of the gold answer under the teacher
