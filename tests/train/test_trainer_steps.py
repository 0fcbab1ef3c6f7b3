"""One full training step of every method and of the method compositions, on a tiny Llama (issues 5 and 6).

Each step runs the real engine, protocol, tools, signals, credit functions and PPO update. Checked: the step's
numbers are finite, advantages are non-zero, parameters change, only policy tokens carry gradient, frozen models
(KL reference, TIPS teacher) receive none, and method-specific invariants.
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import EXAMPLES, METHODS, SMALL, assert_a_real_step

from agentcredit.config import load_config
from agentcredit.train.trainer import Trainer
from tests.rollout.rollout_helpers import one_thread


def make_trainer(name, model, tokenizer, extra=()):
    preset, overrides = METHODS[name]
    config = load_config(preset, [*SMALL, *overrides, *extra])
    return Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)


def fitted(name, request):
    # asked for by name, so a run of codefence methods only never fits the jsoncall model
    model, tokenizer = request.getfixturevalue(
        "fitted_jsoncall" if name.startswith("portool") else "fitted_codefence"
    )
    return copy.deepcopy(model), tokenizer


# PORTool's steps need the second fitted model (jsoncall), so `make test-fast` leaves them to `make test`; its
# learning step stays pinned in test_pinned_step.py
STEP_METHODS = [pytest.param(n, marks=pytest.mark.slow) if n.startswith("portool") else n for n in METHODS]


def snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("name", STEP_METHODS)
def test_one_training_step(name, request):
    model, tokenizer = fitted(name, request)
    trainer = make_trainer(name, model, tokenizer)
    frozen = trainer.frozen_models()
    frozen_before = [snapshot(m) for m in frozen]
    before = snapshot(trainer.model)
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    assert_a_real_step(trainer, result, before)
    # frozen models: no gradient, no change
    for module, saved in zip(frozen, frozen_before, strict=True):
        for n, p in module.named_parameters():
            assert p.grad is None and torch.equal(p, saved[n]), n


def _update_with_garbage_off_policy(trainer, result, garbage: bool):
    batch = copy.deepcopy(result.batch)
    if garbage:  # values a bug could leak through: they must not matter where the mask is 0
        off = ~batch.loss_mask
        batch.advantages = torch.where(off, torch.full_like(batch.advantages, 1e6), batch.advantages)
        batch.old_logp = torch.where(off, torch.full_like(batch.old_logp, float("nan")), batch.old_logp)
    trainer.update(batch)
    return snapshot(trainer.model)


@pytest.mark.parametrize("name", ["grpo", "carl-segment", "carl-critical"])
def test_only_loss_tokens_carry_gradient(name, request):
    """The same update with garbage advantages / log-probs on every non-trained token gives the same weights."""
    model, tokenizer = fitted(name, request)
    trainer = make_trainer(name, model, tokenizer)
    # bit-exact only on one thread: with two, CPU reductions such as the embedding's backward sum in an order that
    # varies between runs (carl-segment, make test 2026-11-29: 157 of 3.1M embedding weights off by <= 1.5e-8, and
    # failing again in 3 of 3 reruns; with one thread it passed in 3 of 3), which is not what this tests
    with one_thread():
        try:
            result = trainer.train_step()
            state = copy.deepcopy(trainer.state_dict())  # weights, value head, optimizer, ...
            clean = _update_with_garbage_off_policy(trainer, result, garbage=False)
            trainer.load_state_dict(state)
            dirty = _update_with_garbage_off_policy(trainer, result, garbage=True)
        finally:
            trainer.close()
    for n in clean:
        torch.testing.assert_close(dirty[n], clean[n], rtol=0, atol=0)


def test_carl_critical_trains_only_selected_actions_once(request):
    from agentcredit.credit import critical_action_advantages
    from agentcredit.train.advantages import decision_tree

    model, tokenizer = fitted("carl-critical", request)
    trainer = make_trainer("carl-critical", model, tokenizer)
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    batch = result.batch
    for t, tree in enumerate(result.trees):
        dt, step_of = decision_tree(tree)
        leaf_rewards = {step_of[leaf]: r for leaf, r in tree.rewards().items()}
        _, _, update = critical_action_advantages(dt.parents, leaf_rewards)
        policy_node = {step: node for node, step in enumerate(step_of) if tree.segment(node).is_policy}
        selected = {policy_node[i] for i in range(1, len(dt.parents)) if update[i]}
        rows = [r for traj in batch.trajectories if traj.tree == t for r in traj.rows]
        trained = {}
        for r in rows:
            for node in batch.segment_ids[r][batch.loss_mask[r]].unique().tolist():
                trained[node] = trained.get(node, 0) + 1
        assert set(trained) == selected  # Eq. 13: actions whose parent has siblings, and only those
        assert all(count == 1 for count in trained.values())  # each selected action enters the update once
    assert result.metrics["critical/actions_updated"] <= result.metrics["critical/actions_rolled"]


def test_tips_teacher_refresh_copies_the_policy(request):
    model, tokenizer = fitted("tips", request)
    trainer = make_trainer("tips", model, tokenizer, ["algorithm.tips.refresh_every=1"])
    teacher_model = trainer.signal_provider("potentials").teacher
    initial = snapshot(teacher_model)
    try:
        trainer.train_step()  # the teacher scored this batch as the initial policy, then is refreshed
    finally:
        trainer.close()
    policy = snapshot(trainer.model)
    teacher = snapshot(teacher_model)
    assert any(not torch.equal(initial[n], teacher[n]) for n in teacher)
    for n in teacher:
        assert torch.equal(teacher[n], policy[n]), n
    assert all(p.grad is None for p in teacher_model.parameters())


def test_non_finite_loss_skips_the_update_and_stops_after_a_streak(request):
    from agentcredit.train.trainer import NonFiniteLoss

    model, tokenizer = fitted("grpo", request)
    trainer = make_trainer("grpo", model, tokenizer, ["train.max_nonfinite=2"])
    try:
        batch = trainer.train_step().batch
        with torch.no_grad():  # a diverged model: its forward pass gives NaN log-probs
            trainer.model.model.norm.weight[0] = float("nan")
        before = snapshot(trainer.model)
        stats = trainer.update(batch)  # one minibatch, skipped: weights untouched, the skip is logged
        assert stats["update/nonfinite_skipped"] == 1.0
        for n, p in trainer.model.named_parameters():
            assert torch.equal(torch.nan_to_num(p), torch.nan_to_num(before[n])), n
        with pytest.raises(NonFiniteLoss, match="non-finite losses in a row"):
            trainer.update(batch)
    finally:
        trainer.close()
