"""The metrics a training step logs about its episodes and its pre-update signals."""

from __future__ import annotations

import numpy as np

from agentcredit.environment import outcome_reward
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.train.batch import TrainBatch
from agentcredit.train.signals import Signals


def episode_metrics(trees: list[RolloutTree], examples: list[Example]) -> dict[str, float]:
    """Reward, accuracy, tool calls and policy tokens per episode (and by arith-tools tier when present)."""
    rewards, correct, calls, tokens, tiers = [], [], [], [], []
    for tree, example in zip(trees, examples, strict=True):
        leaf_rewards = tree.rewards()
        for leaf, reward in leaf_rewards.items():
            path = tree.path(leaf)
            policy = [tree.segment(i) for i in path if tree.segment(i).role == "policy"]
            rewards.append(reward)
            answer = tree.nodes[leaf].info.get("answer")
            correct.append(outcome_reward(example, answer) >= 1.0)
            calls.append(sum(len(s.info.get("calls", [])) for s in policy))
            tokens.append(sum(len(s) for s in policy))
            tiers.append(example.info.get("tier"))
    out = {
        "reward/mean": float(np.mean(rewards)),
        "reward/std": float(np.std(rewards)),
        "accuracy": float(np.mean(correct)),
        "episode/tool_calls": float(np.mean(calls)),
        "episode/policy_tokens": float(np.mean(tokens)),
        "episode/count": float(len(rewards)),
    }
    for tier in sorted({t for t in tiers if t}):
        sel = [i for i, t in enumerate(tiers) if t == tier]
        out[f"tier_{tier}/tool_call_rate"] = float(np.mean([calls[i] > 0 for i in sel]))
        out[f"tier_{tier}/accuracy"] = float(np.mean([correct[i] for i in sel]))
    return out


def signal_metrics(batch: TrainBatch, signals: Signals) -> dict[str, float]:
    """Policy entropy, KL to the reference, the critic's explained variance and the methods' signal scales."""
    out: dict[str, float] = {}
    mask = batch.policy_mask
    if batch.old_entropy is not None and mask.any():
        out["policy/entropy"] = float(batch.old_entropy[mask].mean())
    if batch.ref_logp is not None and mask.any():
        out["policy/kl_ref"] = float((batch.old_logp - batch.ref_logp)[mask].mean())
    if batch.value_mask is not None and batch.returns is not None and batch.old_values is not None:
        vm = batch.value_mask
        if vm.sum() > 1:
            ret, val = batch.returns[vm], batch.old_values[vm]
            var = ret.var()
            out["critic/explained_variance"] = float(1 - (ret - val).var() / var) if var > 0 else 0.0
            out["critic/value_mean"] = float(val.mean())
    if signals.alpha is not None:
        out["tips/alpha"] = float(signals.alpha)
    if signals.teacher_logp is not None and mask.any():
        out["gear/rkl_mean"] = float((batch.old_logp - signals.teacher_logp)[mask].mean())
    return out
