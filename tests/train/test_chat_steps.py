"""Every method trains on the ``chat`` protocol (the model's own tool calling; issue 15): one real step each on a
tiny Llama fitted on chat-format demonstrations, through the engine, the suite's calculator and the update."""

from __future__ import annotations

import copy

import pytest
from train_helpers import CHAT, METHODS, SMALL, assert_a_real_step, one_step

from agentcredit.config import load_config
from agentcredit.credit.methods import BUILT_IN

BASE_METHODS = list(BUILT_IN)  # every built-in method


@pytest.mark.parametrize("name", BASE_METHODS)
def test_one_training_step_on_the_chat_protocol(name, fitted_chat):
    model, tokenizer = copy.deepcopy(fitted_chat[0]), fitted_chat[1]
    preset, overrides = METHODS[name]
    config = load_config(preset, [*SMALL, *overrides, *CHAT])
    trainer, result, before = one_step(config, model, tokenizer)
    assert_a_real_step(trainer, result, before)
    kinds = {
        tree.segment(node).kind for tree in result.trees for node in range(len(tree.nodes))
        if tree.segment(node).role == "policy"
    }  # fmt: skip
    assert kinds <= {"invoke", "commit"} and "commit" in kinds
