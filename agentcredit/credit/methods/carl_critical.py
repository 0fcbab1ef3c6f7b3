"""carl-critical: advantages of the critical actions of an entropy-guided rollout tree (Eqs. 9-13, 2).

The maths is :func:`critical_action_advantages`: action advantages from tree values, trained only on critical
actions. Paper: "CARL: Critical-Action-Focused RL for multi-turn search agents" (spec ``carl-critical-actions.md``
Sec. 3.3-3.11). Nodes are states and each non-root node v is the state reached by one action, the edge
(u = parent(v), v). Values are tree averages (Eqs. 9-10, Algorithm 2)::

    V(leaf) = R(leaf)
    V(u)    = (1 / |child(u)|) * sum_{v in child(u)} V(v)     mean over CHILDREN, not over leaves
    A(u->v) = V(v) - V(u)                                     Eq. 11

Each child counts equally in its parent's mean whatever the size of its subtree (unlike TreeRL's leaf average,
App. A.1); the mean includes the child itself, so siblings' advantages sum to zero and an only child gets
exactly 0. No std normalisation appears in the paper (A in [-1, 1] for R in [0, 1]).

Update set (which actions are trained), ``rule``:

* ``"multi_child"`` (default; Eq. 13 read literally): train (u -> v) iff |child(u)| > 1.
* ``"forked_parent"`` (spec ambiguity A1, reconciling Eq. 13 with App. C.1 "actions in this phase [the N_0
  initial trajectories] are not included in training"): train (u -> v) iff u was selected for forking at
  least once in phase 2. Needs ``fork_counts``. Identical to Eq. 13 when N_0 = 1. The spec recommends it as
  the default; the paper writes Eq. 13, and where spec and paper disagree the paper wins, so it is an option.
* ``"inherit"`` (ablation #3, Eq. 16, "update all actions"): every action is trained; an action whose parent
  has a single child inherits the advantage of the edge into its parent (recursively), 0 below a
  single-child root (spec A13).

Ablation #1 ("outcome reward": every root-to-leaf chain as an independent trajectory, its GRPO-normalised
outcome on every critical action of the chain, duplicated per chain) does not fit one value per node; it is
:func:`critical_action_outcome_advantages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit._stats import mean, zscore
from agentcredit.credit._tree import DecisionTree, leaf_values, parse_tree
from agentcredit.credit._validate import as_int, choice, finite_float
from agentcredit.credit.estimators import EpisodeBatch, Estimate, episode_groups, leaf_rewards
from agentcredit.credit.methods.base import Method, Needs, Settings

__all__ = [
    "METHOD",
    "CarlCriticalSettings",
    "UPDATE_RULES",
    "critical_action_advantages",
    "critical_action_outcome_advantages",
]

UpdateRule = Literal["multi_child", "forked_parent", "inherit"]
UPDATE_RULES: tuple[str, ...] = ("multi_child", "forked_parent", "inherit")


def _values(tree: DecisionTree, rewards: dict[int, float]) -> list[float]:
    values = [0.0] * len(tree)
    for node in reversed(tree.order):  # children before parents (Algorithm 2, post-order)
        kids = tree.children[node]
        values[node] = rewards[node] if not kids else mean([values[c] for c in kids])
    return values


def _fork_counts(tree: DecisionTree, fork_counts: Mapping[int, int] | Sequence[int] | None) -> list[int]:
    if fork_counts is None:
        raise ValueError(
            'rule="forked_parent" needs fork_counts: how often each state was selected for forking in phase 2'
        )
    if isinstance(fork_counts, Mapping):
        items = list(fork_counts.items())
    elif isinstance(fork_counts, Sequence) and not isinstance(fork_counts, str | bytes):
        if len(fork_counts) != len(tree):
            raise ValueError(f"fork_counts has {len(fork_counts)} entries but the tree has {len(tree)} nodes")
        items = list(enumerate(fork_counts))
    else:
        raise ValueError(
            f"fork_counts must be a mapping node -> count or a per-node list, got {fork_counts!r}"
        )
    counts = [0] * len(tree)
    for key, value in items:
        node = as_int(key, "a key of fork_counts")
        if not 0 <= node < len(tree):
            raise ValueError(f"fork_counts: {node} is not a node id (valid ids are 0..{len(tree) - 1})")
        count = as_int(value, f"fork_counts[{node}]")
        if count < 0:
            raise ValueError(f"fork_counts[{node}] must be >= 0, got {count}")
        if count > 0 and not tree.children[node]:
            raise ValueError(
                f"fork_counts[{node}] = {count} but node {node} is a leaf; only states are forked"
            )
        counts[node] = count
    return counts


def critical_action_advantages(
    parents: Sequence[int] | Tensor,
    leaf_rewards: Mapping[int, float],
    *,
    rule: UpdateRule = "multi_child",
    fork_counts: Mapping[int, int] | Sequence[int] | None = None,
) -> tuple[list[float], list[float], list[bool]]:
    """Tree values, per-action advantages and the update set of one question's rollout tree.

    Args:
        parents: ``parents[i]`` = parent of node i, -1 for the root (node 0, the question state).
        leaf_rewards: outcome reward of every leaf (and of leaves only).
        rule: update-set rule, see the module docstring (paper default ``"multi_child"``, Eq. 13).
        fork_counts: times each node was selected for forking in phase 2 (only for ``"forked_parent"``);
            a mapping node -> count (missing nodes count 0) or one count per node.

    Returns:
        ``(values, advantages, update)``, one entry per node. ``advantages[v]`` is the advantage of the
        action that reached v (0.0 for the root); ``update[v]`` says whether that action is trained (False for
        the root).
    """
    tree = parse_tree(parents)
    rewards = leaf_values(tree, leaf_rewards, "leaf_rewards")
    return _advantages(tree, rewards, rule, fork_counts)


def _advantages(
    tree: DecisionTree,
    rewards: dict[int, float],
    rule: str,
    fork_counts: Mapping[int, int] | Sequence[int] | None,
) -> tuple[list[float], list[float], list[bool]]:
    choice(rule, "rule", UPDATE_RULES)
    if rule != "forked_parent" and fork_counts is not None:
        raise ValueError(f'fork_counts is only used by rule="forked_parent", not rule={rule!r}')
    values = _values(tree, rewards)
    n = len(tree)
    advantages = [0.0] * n
    update = [False] * n
    counts = _fork_counts(tree, fork_counts) if rule == "forked_parent" else None
    for v in tree.order[1:]:  # parents first, so an inherited advantage is already known
        u = tree.parents[v]
        multi = len(tree.children[u]) > 1
        if rule == "inherit":
            advantages[v] = values[v] - values[u] if multi else advantages[u]  # advantages[0] = 0 (A13)
            update[v] = True
        else:
            advantages[v] = values[v] - values[u]
            update[v] = multi if counts is None else counts[u] > 0
    return values, advantages, update


def critical_action_outcome_advantages(
    parents: Sequence[int] | Tensor,
    leaf_rewards: Mapping[int, float],
    *,
    normalise: bool = True,
    eps: float = 1e-6,
    rule: Literal["multi_child", "forked_parent"] = "multi_child",
    fork_counts: Mapping[int, int] | Sequence[int] | None = None,
) -> dict[int, list[tuple[int, float]]]:
    """Ablation #1 of the paper (Table 4, "outcome reward"): per-chain outcome credit on critical actions.

    The tree is the same as CARL's and only critical actions are trained, but every root-to-leaf chain is an
    independent trajectory whose outcome is assigned to all critical actions on it; an action on k chains is
    trained k times, once per chain. The paper does not say whether the outcome is normalised; following spec
    A13 it is GRPO-normalised over the question's chains by default (``normalise=True``; ``False`` uses raw R).

    Returns:
        leaf -> ``[(node, advantage), ...]`` for the critical actions on the chain to that leaf, depth 1 first.
        Each pair is one training copy of the action that reached ``node``.
    """
    if rule not in ("multi_child", "forked_parent"):
        raise ValueError(
            f'rule must be "multi_child" or "forked_parent" for the outcome ablation, got {rule!r}'
        )
    eps = finite_float(eps, "eps")
    tree = parse_tree(parents)
    rewards = leaf_values(tree, leaf_rewards, "leaf_rewards")
    _, _, update = _advantages(tree, rewards, rule, fork_counts)
    leaves = list(tree.leaves)
    outcomes = [rewards[leaf] for leaf in leaves]
    credit = zscore(outcomes, eps) if normalise else outcomes
    return {
        leaf: [(node, a) for node in tree.path(leaf) if update[node]]
        for leaf, a in zip(leaves, credit, strict=True)
    }


class CarlCriticalSettings(Settings):
    update_rule: Literal["multi_child", "forked_parent", "inherit"] = Field(
        "multi_child",
        description="Update set (Eq. 13 literal: multi_child; carl-critical-actions.md A1: forked_parent; "
        "ablation #3: inherit).",
    )


def estimate(batch: EpisodeBatch, settings: CarlCriticalSettings) -> Estimate:
    update_rule = settings.update_rule
    adv = batch.zeros()
    loss_mask = torch.zeros(batch.shape, dtype=torch.bool)
    rolled = updated = 0
    groups = episode_groups(batch)
    for group, members in groups.items():
        tree = batch.tree(group, "carl-critical")
        kwargs = {"fork_counts": dict(tree.fork_counts or {})} if update_rule == "forked_parent" else {}
        _, node_adv, update = critical_action_advantages(
            list(tree.parents),
            leaf_rewards(batch, members, "carl-critical"),
            rule=update_rule,
            **kwargs,  # type: ignore[arg-type]
        )
        rolled += len(tree.parents) - 1
        updated += sum(update)
        trained: set[int] = set()
        for j in members:
            for s in batch.episodes[j].steps:
                adv[s.row, s.start : s.end] = node_adv[s.node]
                # each selected action enters the update once, in the first episode that holds it
                # (carl-critical-actions.md §3.7)
                if update[s.node] and s.node not in trained:
                    trained.add(s.node)
                    loss_mask[s.row, s.start : s.end] = True
    n = max(len(groups), 1)  # per question, as the paper reports them
    stats = {"critical/actions_rolled": rolled / n, "critical/actions_updated": updated / n}
    return Estimate(adv, loss_mask, stats=stats)


METHOD = Method(
    name="carl-critical",
    settings=CarlCriticalSettings,
    # loss: Eq. 2's 1/|D| over the tokens of the update set, token-mean (the default)
    needs=Needs(rollout="entropy_guided", step_inputs=frozenset({"tree"})),
    source="carl-critical Eqs. 9-13, 2",
    estimate=estimate,
    # task.metric: the paper's format gate x set-F1 (set_f1_format, carl-critical-actions.txt l. 513) on the QA
    # presets, the task's numeric match on arith-tools and gsm8k (a labelled deviation, docs/specs/README.md)
    report_settings=("rollout.forks_per_round", "task.metric"),
    former_keys=(("algorithm.critical", "algorithm.carl_critical"),),
    former_names=("critical",),
)
