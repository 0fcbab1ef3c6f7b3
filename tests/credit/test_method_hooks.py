"""The hooks a method gives a trainer besides its advantages (``Method.batch_signals``, ``trainer_checks``,
``critic_values``, ``token_weights``): each trainer calls them on the method object, never by the method's name."""

from __future__ import annotations

import pytest
import torch

from agentcredit.credit import METHODS, Episode, EpisodeBatch, resolve_method


def _potentials_batch(potentials):
    """One episode per entry of ``potentials`` (the hook reads only the signal)."""
    episodes = [Episode("q", 0.0, (), ()) for _ in potentials]
    return EpisodeBatch(
        (len(potentials), 4), episodes, signals={"potentials": [tuple(p) for p in potentials]}
    )


def test_tips_batch_signals_by_hand_and_the_state_it_carries():
    tips = METHODS["tips"]
    batch_target = tips.settings(alpha_mode="batch_target", alpha=0.02, target_mean_abs=0.11)
    batch = _potentials_batch([[-3.0, -1.5, -0.5], [-3.0, -3.4], [-2.0]])
    signals, state, stats = tips.batch_signals(batch, batch_target, {})
    # deltas 1.5, 1.0, -0.4: mean |d| = 2.9 / 3, so alpha = 0.11 / (2.9 / 3)
    alpha = 0.11 / (2.9 / 3)
    assert signals == {"alpha": pytest.approx(alpha)} and state == {"tips_alpha": pytest.approx(alpha)}
    assert stats == {
        "tips_alpha": pytest.approx(alpha),
        "tips_phi0_mean": pytest.approx((-3.0 - 3.0 - 2.0) / 3),
        "tips_dphi_abs_mean": pytest.approx(2.9 / 3),
    }
    # a batch without a tool turn keeps the alpha carried in the state, or the start value without one
    flat = _potentials_batch([[-1.0], [-2.0]])
    assert tips.batch_signals(flat, batch_target, {"tips_alpha": 0.37})[0] == {"alpha": 0.37}
    assert tips.batch_signals(flat, batch_target, {})[1] == {"tips_alpha": 0.02}
    assert tips.batch_signals(flat, tips.settings(alpha=0.3), {"tips_alpha": 0.37})[0] == {"alpha": 0.3}


def _verl_config(loss_agg_mode="seq-mean-token-sum", shuffle=False, distillation=False, log_probs=True):
    return {
        "actor_rollout_ref": {
            "actor": {"loss_agg_mode": loss_agg_mode, "shuffle": shuffle},
            "rollout": {"calculate_log_probs": log_probs},
        },
        "critic": {"shuffle": False},
        "distillation": {"enabled": distillation},
    }


def test_trainer_checks_give_one_line_errors_per_part():
    method, _ = resolve_method("carl-segment")
    settings = {"carl_segment": METHODS["carl-segment"].settings_class("verl")(segment_mean_loss=True)}
    assert method.trainer_errors("verl", _verl_config(), settings) == []
    assert method.trainer_errors("native", _verl_config(shuffle=True), settings) == []  # no native checks
    errors = method.trainer_errors(
        "verl", _verl_config("token-mean", shuffle=True, distillation=True), settings
    )
    assert len(errors) == 3 and all("\n" not in e for e in errors)
    assert "agentcredit.method=carl-segment with segment_mean_loss=True" in errors[0]
    assert "actor_rollout_ref.actor.shuffle=False" in errors[1] and "distillation" in errors[2]
    gear = METHODS["gear"]
    parts = gear.settings_from(type("Block", (), {"gear": gear.settings_class("verl")()})())
    assert gear.trainer_errors("verl", _verl_config(log_probs=True), parts) == []
    (error,) = gear.trainer_errors("verl", _verl_config(log_probs=False), parts)
    assert error.startswith("agentcredit.gear.student_logprobs=rollout needs")


def test_critic_hooks_are_the_methods_own():
    assert METHODS["ppo"].critic_values is None and METHODS["ppo"].token_weights is None
    head = torch.tensor([0.0, 2.0])
    torch.testing.assert_close(METHODS["carl-segment"].critic_values(head), torch.sigmoid(head))
    assert METHODS["carl-segment"].token_weights is not None
