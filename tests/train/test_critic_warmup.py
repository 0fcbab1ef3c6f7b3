"""``train.critic_warmup`` (verl's ``trainer.critic_warmup``): the first N steps fit only the value head.

The head shares the policy's backbone, so during those steps neither the backbone nor the LM head may move: the
policy that produced the rollouts is the one the critic is being fitted to. After them, ordinary updates resume.
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import ConfigError, load_config
from agentcredit.train.trainer import Trainer


def snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def changed(module, before):
    return [n for n, p in module.named_parameters() if not torch.equal(p, before[n])]


@pytest.mark.parametrize("preset", ["carl-segment-arith-tools", "ppo-arith-tools"])
def test_warmup_steps_move_only_the_value_head(preset, fitted_codefence):
    model, tokenizer = fitted_codefence
    config = load_config(preset, [*SMALL, "train.critic_warmup=1"])
    trainer = Trainer(
        config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    try:
        policy, head = snapshot(trainer.model), snapshot(trainer.value_head)
        # gradients are freed after each optimiser step, so watch them arrive instead of looking for them after
        got_grad: set[str] = set()
        hooks = [
            p.register_post_accumulate_grad_hook(lambda _p, n=n: got_grad.add(n))
            for n, p in trainer.model.named_parameters()
        ]
        first = trainer.train_step().metrics
        for hook in hooks:
            hook.remove()
        assert changed(trainer.model, policy) == []  # backbone and LM head untouched
        assert got_grad == set(), "the backbone got a gradient in a critic-only step"
        assert changed(trainer.value_head, head), "the warm-up step did not train the critic"
        assert first["update/critic_only"] == 1.0 and first["loss/value"] > 0 and first["loss/policy"] == 0
        policy = snapshot(trainer.model)
        second = trainer.train_step().metrics
        assert changed(trainer.model, policy), "after the warm-up the policy trains again"
        assert "update/critic_only" not in second
    finally:
        trainer.close()


def test_critic_warmup_needs_a_critic():
    with pytest.raises(ConfigError, match="critic_warmup"):
        load_config("grpo-arith-tools", ["train.critic_warmup=2"])
