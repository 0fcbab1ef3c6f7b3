"""Issue 11: updates in which some rows train nothing, T_max and dual-clip reaching the trainer from the config.

carl-critical trains only the actions of its update set, each once, so a trajectory row whose actions are all
outside the set (or counted in an earlier row) has an all-false loss mask. A microbatch of only such rows has no
policy, KL or entropy term and, without a critic, no value term: before the fix its loss had no graph and
``loss.backward()`` raised "element 0 of tensors does not require grad". The microbatch split never changes the
gradient, so the tests force one row per microbatch (``train.micro_batch_tokens``), the split where this always
shows.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.models.loading import load_base_model
from agentcredit.models.tiny import tiny_llama
from agentcredit.rollout.strategies import EntropyGuided
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.advantages import compute_advantages
from agentcredit.train.batch import build_batch
from agentcredit.train.signals import trained_row_chunks
from agentcredit.train.trainer import Trainer


def one_row_per_microbatch(trainer: Trainer) -> None:
    trainer.cfg.train.micro_batch_tokens = 1


def snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def changed(module, before) -> list[str]:
    return [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]


def tiny_trainer(preset: str, overrides=()) -> Trainer:
    model, tokenizer = load_base_model("tiny", seed=0)
    config = load_config(preset, [*SMALL, *overrides])
    return Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)


# ------------------------------------------------------------------------------------------ the real preset
def test_carl_critical_arith_tools_preset_protocol():
    """The preset is the paper's state (whole context, tool outputs kept inline), not carl-segment's replacement
    mode, and caps actions at the method's T_max = 10 (the tags protocol needs a search corpus arith-tools lacks)."""
    for preset in ("carl-critical-arith-tools", "carl-critical-gsm8k"):
        c = load_config(preset)
        assert c.protocol.name == "codefence"
        assert c.protocol.options["replacement"] is False
        assert c.protocol.options["max_segments"] == c.rollout.max_turns == c.rollout.t_max == 10


@pytest.mark.parametrize(
    "overrides",
    [
        ["rollout.n=4"],
        # spec A1's rule with N0 > 1: unforked phase-1 episodes have no selected action at all
        ["rollout.n0=2", "rollout.n=2", "algorithm.carl_critical.update_rule=forked_parent"],
    ],
    ids=["preset", "forked_parent-n0=2"],
)
def test_one_update_on_the_carl_critical_preset(fitted_codefence, overrides):
    model, tokenizer = fitted_codefence
    config = load_config("carl-critical-arith-tools", [*SMALL, *overrides])
    trainer = Trainer(
        config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    one_row_per_microbatch(trainer)
    assert isinstance(trainer.rollouts.strategy, EntropyGuided) and trainer.rollouts.strategy.t_max == 10
    before = snapshot(trainer.model)
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    m, batch = result.metrics, result.batch
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    if "forked_parent" in " ".join(overrides):
        assert (~batch.loss_mask.any(-1)).any(), "this run should hold a row with nothing to train"
    assert m["tokens/trained"] > 0 and m["loss/total"] != 0
    assert changed(trainer.model, before)
    assert all(tree.info["t_max"] == 10 for tree in result.trees)


# ------------------------------------------------------------------------------------------ hand-built trees
def pol(ids):
    return Segment(ids, role="policy", kind="step", logprobs=[-1.0] * len(ids), entropies=[1.0] * len(ids))


def obs(ids):
    return Segment(ids, role="observation", kind="observation")


def forked_tree(forked: bool) -> RolloutTree:
    """N0 = 2 phase-1 episodes A and B, then (``forked``) one fork from the state after B's first action.

    Under ``forked_parent`` only the actions taken from a forked state are trained, so trajectory A, the first
    row of the batch, has no selected action; without the fork no row has one.
    """
    tree = RolloutTree(Segment([1, 2, 3], role="prompt"))
    a_leaf = tree.add_path([pol([10, 11]), obs([20]), pol([12, 13])])
    b1 = tree.add(pol([14, 15]), 0)
    state = tree.add(obs([21]), b1)
    b_leaf = tree.add(pol([16, 17]), state)
    tree.set_reward(a_leaf, 0.0)
    tree.set_reward(b_leaf, 1.0)
    if forked:
        fork_leaf = tree.add(pol([18, 19]), state)
        tree.set_reward(fork_leaf, 0.0)
    tree.info["fork_counts"] = {str(state): 1} if forked else {}
    tree.info["n0"], tree.info["n_forks"] = 2, int(forked)
    return tree


def prepared_batch(trainer: Trainer, trees):
    batch = build_batch(trees, pad_id=trainer.pad_id)
    signals = trainer.compute_signals(batch, trees, EXAMPLES[: len(trees)])
    adv = compute_advantages(trainer.cfg.algorithm, batch, trees, signals)
    batch.advantages, batch.loss_mask = adv.advantages, adv.loss_mask
    batch.returns, batch.value_mask = adv.returns, adv.value_mask
    return batch


def test_forked_parent_tree_whose_first_row_has_no_selected_action():
    trainer = tiny_trainer("carl-critical-arith-tools", ["algorithm.carl_critical.update_rule=forked_parent"])
    one_row_per_microbatch(trainer)
    try:
        batch = prepared_batch(trainer, [forked_tree(forked=True)])
        assert batch.loss_mask.any(-1).tolist() == [False, True, True]
        before = snapshot(trainer.model)
        stats = trainer.update(batch)
    finally:
        trainer.close()
    assert stats["update/nonfinite_skipped"] == 0 and math.isfinite(stats["loss/total"])
    # siblings' advantages sum to zero (+0.5, -0.5), so the loss is 0 at ratio 1, its gradient is not
    assert stats["update/grad_norm"] > 0
    assert changed(trainer.model, before)


def test_a_batch_with_nothing_to_train_is_a_no_op():
    trainer = tiny_trainer("carl-critical-arith-tools", ["algorithm.carl_critical.update_rule=forked_parent"])
    one_row_per_microbatch(trainer)
    try:
        batch = prepared_batch(trainer, [forked_tree(forked=False)])
        assert not batch.loss_mask.any()
        before = snapshot(trainer.model)
        stats = trainer.update(batch)
    finally:
        trainer.close()
    assert stats["loss/total"] == 0 and stats["update/grad_norm"] == 0
    assert not changed(trainer.model, before)


def test_value_positions_alone_still_train_the_critic():
    """A row with value targets but no policy-loss token (ppo: token critic) still enters the update."""
    trainer = tiny_trainer("ppo-arith-tools")
    one_row_per_microbatch(trainer)
    tree = RolloutTree(Segment([1, 2, 3], role="prompt"))
    for ids, reward in (([10, 11, 12], 1.0), ([13, 14], 0.0)):
        tree.set_reward(tree.add(pol(ids), 0), reward)
    try:
        batch = prepared_batch(trainer, [tree])
        batch.loss_mask[0] = False  # row 0: value positions only
        assert batch.value_mask[0].any()
        head_before = snapshot(trainer.value_head)
        out = trainer._minibatch_step(batch.select([0]), 1.0)
    finally:
        trainer.close()
    assert out["loss/policy"] == 0 and out["loss/value"] > 0
    assert changed(trainer.value_head, head_before)


def test_trained_row_chunks_keeps_rows_with_a_loss_or_value_term():
    loss = torch.tensor([[False, False], [False, True], [False, False], [True, False]])
    vw = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.5], [0.0, 0.0]])
    seqs = [[5, 6], [5, 7], [5, 8], [5, 9]]
    model, _ = tiny_llama()  # sdpa: rows are packed, so a chunk's size is its distinct tokens
    assert trained_row_chunks(model, seqs, loss, max_tokens=1) == [[1], [3]]
    assert trained_row_chunks(model, seqs, loss, vw, max_tokens=1) == [[1], [2], [3]]
    assert trained_row_chunks(model, seqs, loss, vw, max_tokens=100) == [[1, 2, 3]]
    assert trained_row_chunks(model, seqs, loss, vw, max_tokens=4) == [
        [1, 2, 3]
    ]  # the shared token counts once
    model.config._attn_implementation = "flash_attention_2"  # not packable: rows x padded width
    assert trained_row_chunks(model, seqs, loss, vw, max_tokens=4) == [[1, 2], [3]]


# ------------------------------------------------------------------------------------------ dual clip
def test_dual_clip_presets():
    """tips.md 3.6 / 4.2-4.3 (TIPS Table 9): clip_ratio_c = 3.0 for PPO, TIPS and GRPO; the other methods' papers
    do not name it."""
    for method in ("grpo", "ppo", "tips"):
        assert load_config(f"{method}-arith-tools").algorithm.clip_ratio_c == 3.0
    for method in ("carl-segment", "carl-critical", "portool", "gear"):
        assert load_config(f"{method}-arith-tools").algorithm.clip_ratio_c is None


@pytest.mark.parametrize(("clip_ratio_c", "expected"), [("3.0", 0.9), ("null", 1.9)])
def test_clip_ratio_c_reaches_the_policy_loss(clip_ratio_c, expected):
    """Two trained tokens at ratio r = 5, eps = 0.2, token-mean:

    A = -1: plain PPO max(-A r, -A clip(r)) = max(5, 1.2) = 5; dual-clip min(5, -c A) = 3.
    A = +1: max(-5, -1.2) = -1.2 either way (dual-clip only acts on A < 0).
    Loss: (3 - 1.2) / 2 = 0.9 with c = 3, (5 - 1.2) / 2 = 1.9 without.
    """
    trainer = tiny_trainer(
        "grpo-arith-tools", ["algorithm.kl_coef=0.0", f"algorithm.clip_ratio_c={clip_ratio_c}"]
    )
    tree = RolloutTree(Segment([1, 2, 3], role="prompt"))
    tree.set_reward(tree.add(pol([10, 11, 12]), 0), 1.0)
    try:
        batch = prepared_batch(trainer, [tree])
        cols = batch.policy_mask[0].nonzero(as_tuple=True)[0][:2]
        batch.loss_mask[:] = False
        batch.loss_mask[0, cols] = True
        batch.advantages[:] = 0.0
        batch.advantages[0, cols] = torch.tensor([-1.0, 1.0])
        trainer.model.train()
        batch.old_logp[0, cols] = batch.old_logp[0, cols] - math.log(5.0)  # old_logp is the current logp
        out = trainer._minibatch_step(batch, 1.0)
    finally:
        trainer.close()
    assert out["loss/policy"] == pytest.approx(expected, abs=1e-4)
