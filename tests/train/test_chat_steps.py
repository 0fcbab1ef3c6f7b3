"""Every method trains on the ``chat`` protocol (the model's own tool calling; issue 15): one real step each on a
tiny Llama fitted on chat-format demonstrations, through the engine, the suite's calculator and the update."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from train_helpers import CHAT, EXAMPLES, METHODS, SMALL

from agentcredit.config import load_config
from agentcredit.train.trainer import Trainer

BASE_METHODS = ["grpo", "ppo", "carl-segment", "carl-critical", "tips", "gear", "portool", "gigpo"]


@pytest.mark.parametrize("name", BASE_METHODS)
def test_one_training_step_on_the_chat_protocol(name, fitted_chat):
    model, tokenizer = copy.deepcopy(fitted_chat[0]), fitted_chat[1]
    preset, overrides = METHODS[name]
    config = load_config(preset, [*SMALL, *overrides, *CHAT])
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    m = result.metrics
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    assert m["adv/nonzero_frac"] > 0 and m["tokens/trained"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)
    batch = result.batch
    assert not (batch.loss_mask & ~batch.policy_mask).any()
    kinds = {
        tree.segment(node).kind for tree in result.trees for node in range(len(tree.nodes))
        if tree.segment(node).role == "policy"
    }  # fmt: skip
    assert kinds <= {"invoke", "commit"} and "commit" in kinds
