"""Per-token advantages for a training batch: the native trainer's side of :mod:`agentcredit.credit.methods`.

This module only *lays out* data: it turns the rollout trees and the batch into the neutral per-episode layout
(:func:`episode_batch`) and calls the one entry the verl adapter calls too,
``method.advantages(layout, method.settings_from(config.algorithm))``, for the method ``config.algorithm``'s parts
name; then the native trainer's own whitening and statistics. What is native is the layout: a tree's policy
segments become steps whose node ids are their :func:`decision_tree` nodes, so shared prefixes share a node, and a
step's anchor (step input ``anchors``) is every token before it on the tree path (:func:`anchor_states`). What the layout holds
follows the method's :class:`~agentcredit.credit.methods.Needs`, never its name.
"""

from __future__ import annotations

import math

import torch

from agentcredit.config import AlgorithmConfig
from agentcredit.credit import DecisionTree, Episode, EpisodeBatch, Estimate, Step
from agentcredit.rollout.tree import RolloutTree
from agentcredit.train.batch import TrainBatch, segment_spans
from agentcredit.train.signals import Signals

#: What :func:`compute_advantages` returns: the estimator's :class:`~agentcredit.credit.estimators.Estimate`
#: after reweighting and whitening (advantages, loss mask, critic returns and value mask, statistics).
Advantages = Estimate


# ------------------------------------------------------------------------------------------ layout
def decision_tree(tree: RolloutTree) -> tuple[DecisionTree, list[int]]:
    """A rollout tree seen as decisions (carl-critical's action tree, PORTool's step tree): node 0 = the question,
    node i = the state after the i-th policy segment (in node-id order) and its observation.

    Returns the :class:`~agentcredit.credit.DecisionTree` (its fork counts from the strategy's
    ``info["fork_counts"]``, counted per state node: a policy segment or the observation after it; its ``merged``
    from the ``info["merged_from"]`` of a policy segment that stands for identical siblings) and
    ``step_of``: for every rollout-tree node, the decision node whose state it belongs to (0 = the question;
    observations belong to the step that caused them).
    """
    step_of = [0]
    parents = [-1]
    merged: dict[int, int] = {}
    for node in range(1, len(tree)):
        parent_step = step_of[tree.parent(node)]
        if tree.segment(node).role == "policy":
            step_of.append(len(parents))
            if len(members := tree.nodes[node].info.get("merged_from", [])) > 1:
                merged[len(parents)] = len(members)
            parents.append(parent_step)
        else:  # observations belong to the step that caused them
            step_of.append(parent_step)
    for leaf in tree.rewards():
        if step_of[leaf] == 0:
            raise ValueError(f"tree leaf {leaf} has no policy segment on its path")
    counts: dict[int, int] = {}
    for node, c in tree.info.get("fork_counts", {}).items():
        if not 0 <= int(node) < len(tree):
            raise ValueError(f"info['fork_counts'] names node {node}, which the tree does not have")
        step = step_of[int(node)]
        counts[step] = counts.get(step, 0) + int(c)
    return DecisionTree(tuple(parents), counts, merged or None), step_of


def anchor_states(tree: RolloutTree, policy_nodes: list[int]) -> list[tuple[int, ...]]:
    """The anchor state (step input ``anchors``) of each step of a trajectory: every token on the tree path before the step.

    verl-agent groups steps by the environment's observation; a text tool-use episode has no observation apart
    from its context, so here two steps share an anchor exactly when the same token sequence precedes them.
    The path holds raw tool outputs even where replacement mode hid them from the policy; since the tools are
    deterministic that groups exactly the steps whose visible contexts are equal: the prompt for every first
    step of a group, then the steps after identical earlier actions (and therefore identical tool results),
    whether the rollouts were independent or share a tree prefix. Tokens rather than tree nodes, so
    independent rollouts that happened to write the same action still group.
    """
    out = []
    for node in policy_nodes:
        path, at = [], tree.parent(node)
        while at >= 0:
            path.append(at)
            at = tree.parent(at)
        out.append(tuple(tok for n in reversed(path) for tok in tree.segment(n).token_ids))
    return out


def episode_batch(
    cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree], signals: Signals
) -> EpisodeBatch:
    """The batch's trajectories in the neutral layout: one episode per trajectory, grouped by tree."""
    needs = cfg.credit_method.all_needs
    decisions = [decision_tree(tree) for tree in trees] if "tree" in needs.step_inputs else []
    episodes = []
    for traj in batch.trajectories:
        tree = trees[traj.tree]
        anchors = anchor_states(tree, traj.policy_nodes) if "anchors" in needs.step_inputs else None
        steps = []
        for k, (node, (row, first, last)) in enumerate(
            zip(traj.policy_nodes, segment_spans(batch, traj), strict=True)
        ):
            steps.append(
                Step(
                    row,
                    first,
                    last + 1,
                    node=decisions[traj.tree][1][node] if decisions else 0,
                    anchor=anchors[k] if anchors is not None else (),
                    format_reward=float(tree.segment(node).info.get("format_reward", 0.0)),
                    env_reward=float(tree.segment(node).info.get("env_reward", 0.0)),
                )
            )
        episodes.append(Episode(traj.tree, traj.reward, tuple(steps)))
    layout_signals = {
        "values": signals.values,
        "student_logp": batch.old_logp,
        "teacher_logp": signals.teacher_logp,
        "entropy": signals.entropy,
        "alpha": signals.alpha,
        **signals.extra,  # signals registered outside the package, by name, as their providers computed them
    }
    if "potentials" in needs.signals:
        for j, ep in enumerate(episodes):
            if signals.potentials is None or len(signals.potentials[j]) != len(ep.steps):
                got = "no" if signals.potentials is None else len(signals.potentials[j])
                raise ValueError(f"trajectory {j}: {got} potentials for {len(ep.steps)} policy segments")
        layout_signals["potentials"] = [tuple(p) for p in signals.potentials]
    return EpisodeBatch(
        shape=tuple(batch.input_ids.shape),
        episodes=episodes,
        trees={t: tree for t, (tree, _) in enumerate(decisions)},
        signals={name: value for name, value in layout_signals.items() if value is not None},
    )


def compute_advantages(
    cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree], signals: Signals
) -> Advantages:
    """The method's advantages on the batch's layout (shaping, estimate, reweighting), then whitening and
    statistics."""
    method = cfg.credit_method
    needs = method.all_needs
    layout = episode_batch(cfg, batch, trees, signals)
    if "alpha" in needs.signals and signals.alpha is None:
        raise ValueError(f"{method.name} needs this step's shaping scale alpha")
    result = method.advantages(layout, method.settings_from(cfg))
    for part in method.parts:  # what a method logs of its own signals (TIPS: the scale of its potentials)
        if part.stats is not None:
            result.stats.update(part.stats(layout))
    rounds = [float(t.info["rounds"]) for t in trees if "rounds" in t.info]
    if rounds:  # entropy-guided trees: the sequential rounds each question's rollout took (forks_per_round)
        result.stats["critical/rounds"] = math.fsum(rounds) / len(rounds)
    if cfg.whiten_advantages:
        m = result.loss_mask
        vals = result.advantages[m]
        if vals.numel() > 1:
            mean, scale = vals.mean(), vals.std() + 1e-8
            result.advantages = torch.where(m, (result.advantages - mean) / scale, 0.0)
            if result.parts is not None:  # split min: the batch mean is a baseline of the trajectory term
                trj, *rest = result.parts
                result.parts = (
                    torch.where(m, (trj - mean) / scale, 0.0),
                    *(torch.where(m, p / scale, 0.0) for p in rest),
                )
    vals = result.advantages[result.loss_mask]
    if vals.numel():
        result.stats.update(
            {
                "adv/mean": float(vals.mean()),
                "adv/std": float(vals.std()) if vals.numel() > 1 else 0.0,
                "adv/abs_mean": float(vals.abs().mean()),
                "adv/max": float(vals.max()),
                "adv/min": float(vals.min()),
                "adv/nonzero_frac": float((vals != 0).float().mean()),
            }
        )
    result.stats["tokens/trained"] = float(result.loss_mask.sum())
    return result
