"""The metrics a training step logs about its episodes and its pre-update signals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentcredit.credit import Method
from agentcredit.rewards import outcome_reward
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.train.batch import TrainBatch, segment_spans
from agentcredit.train.signals import Signals


def episode_metrics(trees: list[RolloutTree], examples: list[Example]) -> dict[str, float]:
    """Reward, accuracy, tool calls and policy tokens per episode (and by arith-tools tier when present)."""
    rewards, correct, calls, tokens, tiers = [], [], [], [], []
    parts: dict[str, list[float]] = {}  # task.reward as a weighted list: each function's values
    for tree, example in zip(trees, examples, strict=True):
        leaf_rewards = tree.rewards()
        for leaf, reward in leaf_rewards.items():
            path = tree.path(leaf)
            policy = [tree.segment(i) for i in path if tree.segment(i).role == "policy"]
            rewards.append(reward)
            for name, value in (tree.nodes[leaf].info.get("reward_parts") or {}).items():
                parts.setdefault(name, []).append(value)
            correct.append(trajectory_outcome(example, tree.nodes[leaf].info.get("answer")) == "correct")
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
    for name, values in parts.items():  # TRL's names for the same numbers: rewards/<function>/mean and /std
        out[f"rewards/{name}/mean"] = float(np.mean(values))
        out[f"rewards/{name}/std"] = float(np.std(values))
    for tier in sorted({t for t in tiers if t}):
        sel = [i for i, t in enumerate(tiers) if t == tier]
        out[f"tier_{tier}/tool_call_rate"] = float(np.mean([calls[i] > 0 for i in sel]))
        out[f"tier_{tier}/accuracy"] = float(np.mean([correct[i] for i in sel]))
    return out


def signal_metrics(batch: TrainBatch, signals: Signals, methods: Sequence[Method] = ()) -> dict[str, float]:
    """Policy entropy, KL to the reference, the critic's explained variance, and what each of ``methods`` (the
    parts of the run's method, :attr:`Method.parts`) logs of its signals (:attr:`Method.signal_stats`).

    ``critic/explained_variance`` = 1 - Var(G - V) / Var(G) over the step's value positions (G the critic's
    targets). It is undefined when Var(G) = 0 (e.g. every episode of the step got the same reward and there is
    no shaping): the key is then absent from the step's metrics, never 0.0, which would read as "the critic
    explains nothing" and hide the steps where there was nothing to explain.
    """
    out: dict[str, float] = {}
    mask = batch.policy_mask
    if batch.old_entropy is not None and mask.any():
        out["policy/entropy"] = float(batch.old_entropy[mask].mean())
    if mask.any():
        # the rollout's recorded log-probs against the trainer's own forward on the same tokens: ~0 for the HF engine
        # in fp32, a kernel mismatch with another backend (vLLM) or a bf16 rollout copy
        gap = (batch.behaviour_logp - batch.old_logp)[mask]
        out["rollout/logp_gap"] = float(gap.abs().mean())
        out["rollout/logp_gap_max"] = float(gap.abs().max())
    if batch.ref_logp is not None and mask.any():
        out["policy/kl_ref"] = float((batch.old_logp - batch.ref_logp)[mask].mean())
    if batch.value_mask is not None and batch.returns is not None and batch.old_values is not None:
        vm = batch.value_mask
        if vm.sum() > 1:
            ret, val = batch.returns[vm], batch.old_values[vm]
            var = ret.var()
            if var > 0:  # undefined otherwise: logged as absent (see the docstring)
                out["critic/explained_variance"] = float(1 - (ret - val).var() / var)
            out["critic/value_mean"] = float(val.mean())
    for method in methods:  # what each part of the run's method logs of the signals its providers computed
        if method.signal_stats is not None:
            out.update(method.signal_stats(batch, signals))
    return out


@dataclass(frozen=True)
class StepCredit:
    """The credit one policy step (segment) of one trajectory got from the update.

    ``kind``: ``answer`` (the step that gave the episode's answer), ``call`` (a step whose tool calls ran and
    returned results) or ``other`` (a step with no call that ran: cut at a cap, no valid call, codefence's
    ``assimilate`` and tags' ``read`` steps). ``outcome``: see :func:`trajectory_outcome`. ``advantage``: the mean
    over the step's tokens of the advantage the update uses, a token outside the loss mask counting as 0 (it gets
    no gradient). ``tree``: the batch index of the trajectory's tree (its question).
    """

    tree: int
    kind: str
    outcome: str
    advantage: float


def trajectory_outcome(example: Example, answer: str | None) -> str:
    """``correct`` (full outcome reward on the example's metric), ``wrong`` (answered otherwise, an abstention
    included) or ``unfinished`` (no answer: cut at a cap, or ended by its environment)."""
    if answer is None:
        return "unfinished"
    return "correct" if outcome_reward(example, answer) >= 1.0 else "wrong"


def step_credits(trees: list[RolloutTree], examples: list[Example], batch: TrainBatch) -> list[StepCredit]:
    """One :class:`StepCredit` per (trajectory, policy step) of ``batch``, after its advantages are set.

    A step shared by several trajectories of a tree counts once per trajectory, with that trajectory's advantage:
    that is how the loss sees it (PORTool's advantage of a shared step differs between the trajectories through it).
    carl-critical trains a selected shared step in the first trajectory that holds it only, so the others through
    it record 0 for it: its shared (tool-call) steps read lower than the update's per-action credit.
    """
    out = []
    for traj in batch.trajectories:
        tree, example = trees[traj.tree], examples[traj.tree]
        answer = tree.nodes[traj.leaf].info.get("answer")
        outcome = trajectory_outcome(example, answer)
        for node, (row, _, _) in zip(traj.policy_nodes, segment_spans(batch, traj), strict=True):
            tokens = (batch.segment_ids[row] == node) & batch.policy_mask[row]
            trained = float(batch.advantages[row][tokens & batch.loss_mask[row]].sum())
            info = tree.segment(node).info
            if node == traj.policy_nodes[-1] and answer is not None:
                kind = "answer"
            elif info.get("calls") and "results" in info:
                kind = "call"
            else:  # no call, or calls an engine cap (turns, tokens, context) cut before they ran
                kind = "other"
            out.append(StepCredit(traj.tree, kind, outcome, trained / int(tokens.sum())))
    return out


def credit_by_step_kind(credits: list[StepCredit]) -> dict[str, float]:
    """Mean step advantage by step kind, overall and by trajectory outcome: where a method's credit goes.

    Keys ``credit/<kind>_step`` and ``credit/<kind>_step/<outcome>``, present only where such steps exist. Under
    outcome-only GRPO every step of a trajectory gets its trajectory's advantage; a method that gives the answer
    steps of failing trajectories less than their tool-call steps favours calling tools over answering (what
    PORTool's Eq. 2 decay does when R_out = -1, tests/credit/test_portool_advantages.py).
    """
    groups: dict[str, list[float]] = {}
    for c in credits:
        groups.setdefault(f"credit/{c.kind}_step", []).append(c.advantage)
        groups.setdefault(f"credit/{c.kind}_step/{c.outcome}", []).append(c.advantage)
    return {key: math.fsum(vals) / len(vals) for key, vals in sorted(groups.items())}
