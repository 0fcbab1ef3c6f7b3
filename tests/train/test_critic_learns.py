"""Settings that let a PPO-family critic learn within a CPU run's few critic-only steps (issue 48).

* ``train.critic_warmup_epochs``: a critic-only step makes that many passes over its batch (verl's critic gets one
  per step, for hundreds of steps; a CPU run has ~5 critic-only steps).

A bias started at the first batch's mean return was measured too and did not help (docs/results/critic-ev): it
was removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.tree import RolloutTree
from agentcredit.train.trainer import Trainer

PIN = Path(__file__).parent / "data" / "pinned_steps.json"


@pytest.fixture(scope="module")
def ppo_trees() -> list[RolloutTree]:
    return [RolloutTree.from_dict(t) for t in json.loads(PIN.read_text())["ppo"]["trees"]]


def _learn_once(trees, overrides):
    by_id = {e.id: e for e in EXAMPLES}
    config = load_config("ppo-arith-tools", [*SMALL, "train.critic_warmup=1", *overrides])
    model, tokenizer = load_base_model("tiny", seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        result = trainer.learn(trees, [by_id[t.prompt_id] for t in trees])
        steps = trainer.optimizer.state[trainer.value_head.proj.bias]["step"]
        return (
            result,
            float(steps),
            float(trainer.value_head.proj.bias.detach()),
            trainer.optimizer.param_groups[-1]["lr"],
        )
    finally:
        trainer.close()


def test_a_critic_only_step_makes_critic_warmup_epochs_passes(ppo_trees):
    _, one, _, _ = _learn_once(ppo_trees, [])
    _, three, _, _ = _learn_once(ppo_trees, ["train.critic_warmup_epochs=3"])
    assert (one, three) == (1.0, 3.0)
