"""A PPO-family arm's critic-only steps are extra (issue 48): in a study every arm gets ``steps`` policy updates.

The PPO and TIPS presets open with ``train.critic_warmup`` critic-only steps (not the paper's: TIPS Table 10 has
critic_warmup 0, tips.txt l.498). Counted inside ``steps`` they took half of a 10-step study's policy updates from
the PPO-family arms; now they run before them, the evaluations count policy updates, and the budget prices them."""

from __future__ import annotations

from test_study import tiny_study, write

from agentcredit.lab.power import planned_seconds
from agentcredit.lab.study import Study, load_study
from agentcredit.run import HeldoutEvaluation


def test_critic_only_steps_are_added_to_the_arm_not_taken_from_it(tmp_path):
    spec = tiny_study(steps=10)
    spec["arms"].append({"name": "ppo", "preset": "ppo-arith-tools"})
    study = Study(load_study(write(tmp_path / "s.yaml", spec)), tmp_path / "out")
    arms = {a.name: a for a in study.spec.arms}
    warm = study.critic_only_steps(arms["ppo"])
    assert warm == 5  # the PPO preset's train.critic_warmup
    assert study.critic_only_steps(arms["grpo"]) == 0
    assert study.run_config(arms["ppo"], 0).train.steps == 10 + warm
    assert study.run_config(arms["grpo"], 0).train.steps == 10
    assert study.run_config(arms["carl-segment"], 0).train.steps == 10


def test_evaluations_count_policy_updates():
    ev = HeldoutEvaluation({"test": [object()]}, every=4, last_step=10, critic_only=5)
    assert [s for s in range(1, 16) if ev.due(s)] == [9, 13, 15]  # after 4, 8 and 10 policy updates
    plain = HeldoutEvaluation({"test": [object()]}, every=4, last_step=10)
    assert [s for s in range(1, 11) if plain.due(s)] == [4, 8, 10]


def test_the_budget_prices_critic_only_steps_by_hand():
    # ppo: 2 seeds x ((10 + 5) x 20 s + 3 evaluations x 100 s) = 2 x 600 = 1200; grpo: 2 x (10 x 10 + 300) = 800
    plan = planned_seconds({"ppo": 20.0, "grpo": 10.0}, 2, 10, 100.0, 4, {"ppo": 5})
    assert plan == {"ppo": 1200.0, "grpo": 800.0, "total": 2000.0}
