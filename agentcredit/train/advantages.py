"""Per-token advantages for a training batch: the estimator, shaping and reweighting parts of a method.

This module only *routes* data: it reads the rollout trees and the batch, calls the credit functions of
:mod:`agentcredit.credit` (never re-implementing one) and broadcasts their outputs onto tokens.

Parts (``config.algorithm``):
* estimator — ``grpo`` (one value per trajectory), ``gae`` (token critic), ``segment`` (boundary critic, carl-segment),
  ``critical`` (tree values on the action tree, carl-critical), ``portool`` (step advantages on the step tree),
  ``gigpo`` (episode group plus step groups by anchor state, verl-agent's step-level baseline);
* shaping — ``tips``: turn rewards alpha [Phi(S_k) - Phi(S_{k-1})] from teacher potentials, then the outcome minus
  alpha Phi(S_M) on the last turn, placed on the last policy token of each turn (gae) or added to each segment's TD
  error (segment: the boundary critic keeps its Monte-Carlo target R, so V stays a success probability; the shaped
  advantages then telescope to R - V(b_0) - alpha Phi(S_0));
* reweight — ``gear``: the GEAR weight W_t on top of whatever per-token advantage the estimator produced. GEAR's
  weight depends on the advantage only through its sign, so it is read off :func:`gear_advantages` at A = +1 and
  A = -1 and applied token by token (for a constant A this is exactly gear_advantages(A, ...)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from agentcredit.config import AlgorithmConfig
from agentcredit.credit import (
    critical_action_advantages,
    gae_advantages,
    gear_advantages,
    gigpo_advantages,
    grpo_advantages,
    portool_advantages,
    segment_advantages,
    tips_turn_rewards,
)
from agentcredit.rollout.tree import RolloutTree
from agentcredit.train.batch import (
    TrainBatch,
    gather_trajectories,
    scatter_trajectories,
    segment_spans,
    trajectory_tokens,
)
from agentcredit.train.signals import Signals


@dataclass
class Advantages:
    advantages: torch.Tensor  # [N, L]
    loss_mask: torch.Tensor  # [N, L] bool
    returns: torch.Tensor | None = None  # [N, L] critic targets
    value_mask: torch.Tensor | None = None  # [N, L] bool
    stats: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ tree views
@dataclass
class StepTree:
    """A rollout tree seen as decisions: node 0 = the question, node i = the state after policy segment
    ``policy_node[i]`` and its observation (carl-critical's action tree, PORTool's step tree)."""

    parents: list[int]
    policy_node: list[int]  # tree node id of each step (-1 for the root)
    step_of: dict[int, int]  # any tree node -> the step whose state it belongs to (0 = the question)
    step_of_leaf: dict[int, int]  # tree leaf -> step node
    leaf_rewards: dict[int, float]  # step node -> reward, for step leaves


def step_tree(tree: RolloutTree) -> StepTree:
    step_of = {0: 0}
    parents, policy_node = [-1], [-1]
    for node in range(1, len(tree)):
        parent_step = step_of[tree.parent(node)]
        if tree.segment(node).role == "policy":
            step_of[node] = len(parents)
            parents.append(parent_step)
            policy_node.append(node)
        else:  # observations belong to the step that caused them
            step_of[node] = parent_step
    rewards = tree.rewards()
    step_of_leaf = {leaf: step_of[leaf] for leaf in rewards}
    leaf_rewards: dict[int, float] = {}
    for leaf, step in step_of_leaf.items():
        if step == 0:
            raise ValueError(f"tree leaf {leaf} has no policy segment on its path")
        leaf_rewards[step] = rewards[leaf]
    return StepTree(parents, policy_node, step_of, step_of_leaf, leaf_rewards)


# ------------------------------------------------------------------------------------------ estimators
def _broadcast_trajectory_scalar(batch: TrainBatch, per_traj: torch.Tensor) -> torch.Tensor:
    per_row = per_traj[batch.row_traj].to(torch.float32)
    return per_row[:, None] * batch.policy_mask


def _broadcast_nodes(
    batch: TrainBatch, rows: list[int], node_values: dict[int, float], out: torch.Tensor
) -> None:
    for r in rows:
        seg = batch.segment_ids[r]
        mask = batch.policy_mask[r]
        for node, value in node_values.items():
            sel = mask & (seg == node)
            if sel.any():
                out[r, sel] = value


def _turn_rewards(cfg: AlgorithmConfig, batch: TrainBatch, signals: Signals) -> list[list[float]]:
    """Per trajectory: the reward of each policy segment (outcome on the last; TIPS shaping when on)."""
    out = []
    for j, traj in enumerate(batch.trajectories):
        n_seg = len(traj.policy_nodes)
        if cfg.shaping == "tips":
            potentials = signals.potentials[j]
            if len(potentials) != n_seg:
                raise ValueError(f"trajectory {j}: {len(potentials)} potentials for {n_seg} policy segments")
            out.append(tips_turn_rewards(potentials, traj.reward, alpha=signals.alpha))
        else:
            out.append([0.0] * (n_seg - 1) + [traj.reward])
    return out


def tips_stats(potentials: list[list[float]], alpha: float) -> dict[str, float]:
    """The scale of a batch's TIPS potentials, logged every step (tips.md §9.1 logging, a subset).

    ``potentials[j]`` is ``[Phi(S_0), ..., Phi(S_M)]`` of trajectory j. Summed answer log-probs are tens of nats
    on a small model, so these show whether the shaping (alpha |dPhi|, the paper's target ~0.2) or the terminal
    correction (-alpha Phi(S_M), added to the outcome reward of the final turn) dominates the outcome reward.
    ``mean_abs_dphi`` is over every tool turn (0.0 with ``dphi_count`` 0 when no episode called a tool).
    """
    phi_0 = [p[0] for p in potentials]
    phi_last = [p[-1] for p in potentials]
    deltas = [abs(p[k] - p[k - 1]) for p in potentials for k in range(1, len(p))]
    mean_abs = math.fsum(deltas) / len(deltas) if deltas else 0.0
    n = max(len(potentials), 1)
    return {
        "tips/phi_0": math.fsum(phi_0) / n,
        "tips/phi_last": math.fsum(phi_last) / n,
        "tips/mean_abs_dphi": mean_abs,
        "tips/dphi_count": float(len(deltas)),
        "tips/mean_abs_shaping": alpha * mean_abs,
        "tips/terminal_correction": -alpha * math.fsum(phi_last) / n,
    }


def _gae(cfg: AlgorithmConfig, batch: TrainBatch, signals: Signals) -> Advantages:
    token_rewards = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for traj, rewards in zip(batch.trajectories, _turn_rewards(cfg, batch, signals), strict=True):
        for (r, _, last), reward in zip(segment_spans(batch, traj), rewards, strict=True):
            token_rewards[r, last] += reward
    index = trajectory_tokens(batch)
    rew, mask = gather_trajectories(batch, token_rewards, index)
    val, _ = gather_trajectories(batch, signals.values, index)
    adv, ret = gae_advantages(rew, val, mask, gamma=cfg.gamma, lam=cfg.lam)
    return Advantages(
        scatter_trajectories(batch, adv, index),
        batch.policy_mask.clone(),
        returns=scatter_trajectories(batch, ret, index),
        value_mask=batch.policy_mask.clone(),
    )


def _segment(cfg: AlgorithmConfig, batch: TrainBatch, signals: Signals) -> Advantages:
    adv = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    returns = torch.zeros_like(adv)
    value_mask = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    turn_rewards = _turn_rewards(cfg, batch, signals)
    for traj, rewards in zip(batch.trajectories, turn_rewards, strict=True):
        spans = segment_spans(batch, traj)
        boundary_values = [float(signals.values[r, first]) for r, first, _ in spans]
        # rewards[-1] is the outcome (minus alpha Phi(S_M) under TIPS shaping); the others are turn rewards
        seg_adv = segment_advantages(
            boundary_values, rewards[-1], lam=cfg.lam, gamma=cfg.gamma, segment_rewards=rewards[:-1]
        )
        for (r, first, _), node, a in zip(spans, traj.policy_nodes, seg_adv, strict=True):
            sel = batch.policy_mask[r] & (batch.segment_ids[r] == node)
            adv[r, sel] = a
            value_mask[r, first] = True
            returns[r, first] = traj.reward  # Monte-Carlo target at every boundary (carl-segment.md §3.5)
    return Advantages(adv, batch.policy_mask.clone(), returns=returns, value_mask=value_mask)


def _grpo(cfg: AlgorithmConfig, batch: TrainBatch) -> Advantages:
    rewards = torch.tensor([t.reward for t in batch.trajectories], dtype=torch.float64)
    groups = [t.tree for t in batch.trajectories]
    per_traj = grpo_advantages(rewards, groups, eps=cfg.grpo_eps, scale=cfg.grpo_scale)
    return Advantages(_broadcast_trajectory_scalar(batch, per_traj), batch.policy_mask.clone())


def _critical(cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree]) -> Advantages:
    adv = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    loss_mask = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    stats = {"critical/actions_rolled": 0.0, "critical/actions_updated": 0.0}
    for t, tree in enumerate(trees):
        st = step_tree(tree)
        kwargs = {}
        if cfg.critical.update_rule == "forked_parent":
            # the strategy counts forks per state node (a policy segment or the observation after it)
            counts: dict[int, int] = {}
            for node, c in tree.info.get("fork_counts", {}).items():
                step = st.step_of[int(node)]
                counts[step] = counts.get(step, 0) + int(c)
            kwargs["fork_counts"] = counts
        _, step_adv, update = critical_action_advantages(
            st.parents, st.leaf_rewards, rule=cfg.critical.update_rule, **kwargs
        )
        node_adv = {st.policy_node[i]: step_adv[i] for i in range(1, len(st.parents))}
        selected = {st.policy_node[i] for i in range(1, len(st.parents)) if update[i]}
        stats["critical/actions_rolled"] += len(st.parents) - 1
        stats["critical/actions_updated"] += len(selected)
        rows = [r for traj in batch.trajectories if traj.tree == t for r in traj.rows]
        _broadcast_nodes(batch, rows, node_adv, adv)
        # each selected action enters the update once, in the first row that holds it (carl-critical-actions.md §3.7)
        for node in sorted(selected):
            for r in rows:
                sel = batch.policy_mask[r] & (batch.segment_ids[r] == node)
                if sel.any():
                    loss_mask[r] |= sel
                    break
    n = max(len(trees), 1)
    stats = {k: v / n for k, v in stats.items()}  # per question, as the paper reports them
    return Advantages(adv, loss_mask, stats=stats)


def anchor_states(tree: RolloutTree, policy_nodes: list[int]) -> list[tuple[int, ...]]:
    """GiGPO's anchor state of each step of a trajectory: every token on the tree path before the step.

    verl-agent groups steps by the environment's observation; a text tool-use episode has no observation apart
    from its context, so here two steps share an anchor exactly when the same token sequence precedes them.
    The path holds raw tool outputs even where replacement mode hid them from the policy; since the tools are
    deterministic that groups exactly the steps whose visible contexts are equal: the prompt for every first step of a group, then the steps after identical earlier actions (and
    therefore identical tool results), whether the rollouts were independent or share a tree prefix. Tokens
    rather than tree nodes, so independent rollouts that happened to write the same action still group.
    """
    out = []
    for node in policy_nodes:
        path, at = [], tree.parent(node)
        while at >= 0:
            path.append(at)
            at = tree.parent(at)
        out.append(tuple(tok for n in reversed(path) for tok in tree.segment(n).token_ids))
    return out


def _gigpo(cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree]) -> Advantages:
    adv = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    trajectories = batch.trajectories
    anchors = [anchor_states(trees[t.tree], t.policy_nodes) for t in trajectories]
    steps = gigpo_advantages(
        [t.reward for t in trajectories],
        [t.tree for t in trajectories],
        anchors,
        gamma=cfg.gigpo.gamma,
        step_weight=cfg.gigpo.step_weight,
        eps=cfg.grpo_eps,
        scale=cfg.gigpo.mode == "mean_std_norm",
    )
    groups: dict[tuple[int, tuple[int, ...]], int] = {}
    for traj, values, states in zip(trajectories, steps, anchors, strict=True):
        for (row, first, last), value in zip(segment_spans(batch, traj), values.tolist(), strict=True):
            adv[row, first : last + 1] = value * batch.policy_mask[row, first : last + 1]
        for anchor in states:
            groups[(traj.tree, anchor)] = groups.get((traj.tree, anchor), 0) + 1
    sizes = list(groups.values())
    stats = {  # how often a step has company: with size 1 everywhere GiGPO is GRPO
        "gigpo/step_groups": float(len(sizes)),
        "gigpo/grouped_step_fraction": sum(s for s in sizes if s > 1) / max(sum(sizes), 1),
    }
    return Advantages(adv, batch.policy_mask.clone(), stats=stats)


def _portool(cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree]) -> Advantages:
    adv = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    p = cfg.portool
    for t, tree in enumerate(trees):
        st = step_tree(tree)
        lengths = [0] + [len(tree.segment(n)) for n in st.policy_node[1:]]
        fmt = [0.0] + [float(tree.segment(n).info.get("format_reward", 0.0)) for n in st.policy_node[1:]]
        per_leaf = portool_advantages(
            st.parents, lengths, st.leaf_rewards, fmt, gamma=p.gamma, w1=p.w1, root_is_fork=p.root_is_fork
        )
        for traj in batch.trajectories:
            if traj.tree != t:
                continue
            step_leaf = st.step_of_leaf[traj.leaf]
            values = per_leaf[step_leaf]
            if len(values) != len(traj.policy_nodes):
                raise ValueError(f"portool: {len(values)} step advantages for {len(traj.policy_nodes)} steps")
            _broadcast_nodes(batch, traj.rows, dict(zip(traj.policy_nodes, values, strict=True)), adv)
    return Advantages(adv, batch.policy_mask.clone())


def _gear_reweight(
    cfg: AlgorithmConfig, batch: TrainBatch, signals: Signals, adv: torch.Tensor
) -> torch.Tensor:
    g = cfg.gear
    index = trajectory_tokens(batch)
    student, mask = gather_trajectories(batch, batch.old_logp, index)
    teacher, _ = gather_trajectories(batch, signals.teacher_logp, index)
    entropy, _ = gather_trajectories(batch, signals.entropy, index)
    a, _ = gather_trajectories(batch, adv, index)
    out = torch.zeros_like(a)
    for j in range(a.shape[0]):
        kw = dict(lambda_kl=g.lambda_kl, lambda_h=g.lambda_h, alpha=g.alpha, beta=g.beta)
        w_pos = gear_advantages(1.0, student[j], teacher[j], entropy[j], mask[j], **kw)
        w_neg = -gear_advantages(-1.0, student[j], teacher[j], entropy[j], mask[j], **kw)
        out[j] = torch.where(a[j] > 0, w_pos, w_neg) * a[j]
    return scatter_trajectories(batch, out, index)


def compute_advantages(
    cfg: AlgorithmConfig, batch: TrainBatch, trees: list[RolloutTree], signals: Signals
) -> Advantages:
    """Run the configured estimator, then the optional reweighting and whitening."""
    if cfg.estimator == "grpo":
        result = _grpo(cfg, batch)
    elif cfg.estimator == "gae":
        result = _gae(cfg, batch, signals)
    elif cfg.estimator == "segment":
        result = _segment(cfg, batch, signals)
    elif cfg.estimator == "critical":
        result = _critical(cfg, batch, trees)
    elif cfg.estimator == "portool":
        result = _portool(cfg, batch, trees)
    elif cfg.estimator == "gigpo":
        result = _gigpo(cfg, batch, trees)
    else:  # the config validator makes this unreachable
        raise ValueError(f"unknown estimator {cfg.estimator!r}")
    if cfg.shaping == "tips" and signals.potentials is not None and signals.alpha is not None:
        result.stats.update(tips_stats(signals.potentials, signals.alpha))
    if cfg.reweight == "gear":
        result.advantages = _gear_reweight(cfg, batch, signals, result.advantages)
    if cfg.whiten_advantages:
        m = result.loss_mask
        vals = result.advantages[m]
        if vals.numel() > 1:
            result.advantages = torch.where(m, (result.advantages - vals.mean()) / (vals.std() + 1e-8), 0.0)
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
