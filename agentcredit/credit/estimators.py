"""The neutral per-episode layout every credit method reads, built by both trainers.

The native trainer (:mod:`agentcredit.train.advantages`) lays out its rollout trees, the verl adapter
(:mod:`agentcredit.integrations.verl.advantages`) lays out verl's rows; both build an :class:`EpisodeBatch` and
call one entry, ``METHODS[name].advantages(layout, settings)`` (:mod:`agentcredit.credit.methods`): a method's
shaping (optional), its estimate, its reweighting (optional). What stays with each trainer is what differs between
them: where a critic target goes, advantage whitening, and how a loss aggregation is expressed.

**Layout.** Token coordinates are ``(row, column)`` of the caller's ``[N, L]`` tensors. An :class:`Episode`
lists its policy segments ("steps") in temporal order, each trained at the columns ``[start, end)`` of one row;
the episode's trained tokens are its steps' tokens, in step order (this is what lets carl-segment's replacement
mode spread an episode over several rows). Steps carry a node id in their group's :class:`DecisionTree`
(node 0 is the prompt): episodes that share a tree prefix share the node, and independent episodes are chains
under the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from agentcredit.credit._tree import DecisionTree
from agentcredit.credit._validate import finite_where

__all__ = [
    "DecisionTree",
    "Episode",
    "EpisodeBatch",
    "Estimate",
    "Step",
    "chain_trees",
    "episode_groups",
    "leaf_rewards",
    "outcome_part",
]


@dataclass(frozen=True)
class Step:
    """One policy segment of an episode, trained at columns ``[start, end)`` of batch row ``row``."""

    row: int
    start: int
    end: int
    node: int = 0  # its node in the group's decision tree (carl-critical, portool)
    anchor: tuple[Hashable, ...] = ()  # step input "anchors": the tokens before the step
    format_reward: float = 0.0  # portool: the protocol's formatting reward R_fm
    # the reward a per-episode environment's step gave this step's calls (agentcredit.tools.episodes): part of
    # the episode's reward, placed on this step by the step-reward methods and added to PORTool's R_fm(v)
    env_reward: float = 0.0

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Episode:
    """One episode: its group (prompt), outcome reward and steps in temporal order."""

    group: Hashable
    reward: float
    steps: tuple[Step, ...]
    # the steps that end tool turns k = 1..M (a tool output follows each); None = every step but the last (each is
    # followed by a tool output in the native protocols)
    turn_ends: tuple[int, ...] | None = None

    def tool_turn_ends(self) -> tuple[int, ...]:
        return tuple(range(len(self.steps) - 1)) if self.turn_ends is None else self.turn_ends


def outcome_part(ep: Episode) -> float:
    """The episode's reward minus its environment step rewards: the outcome (all of it without an environment)."""
    env = sum(s.env_reward for s in ep.steps)
    return ep.reward - env if env else ep.reward


@dataclass
class EpisodeBatch:
    """A batch of episodes, their groups' decision trees, and the signals the method's
    :class:`~agentcredit.credit.methods.Needs` name.

    ``signals`` is keyed by the signal's name in ``Needs.signals``: a per-token tensor ``[N, L]`` (``values``: V
    of the state before the token; ``student_logp``, ``teacher_logp``, ``entropy``), one entry per episode
    (``potentials``: TIPS's Phi(S_0), ..., Phi(S_M)) or one value for the batch (``alpha``: TIPS's shaping
    scale). A method reads them with :meth:`need` (per token), :meth:`per_episode` or :meth:`signal`; the layout
    itself grows no field for a method's data.
    """

    shape: tuple[int, int]
    episodes: list[Episode]
    trees: Mapping[Hashable, DecisionTree] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    # per episode, per step: the reward placed on the step's last token; None = the outcome on the last step
    step_rewards: list[list[float]] | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        n_rows, length = self.shape
        for j, ep in enumerate(self.episodes):
            for k, s in enumerate(ep.steps):
                if not (0 <= s.row < n_rows and 0 <= s.start < s.end <= length):
                    raise ValueError(
                        f"episode {j} (group {ep.group!r}) step {k}: row {s.row}, tokens [{s.start}, {s.end}) lie "
                        f"outside the batch's {n_rows} rows x {length} tokens (or the span is empty)"
                    )

    def signal(self, name: str, method: str) -> Any:
        """The signal ``name``; a ValueError naming the method when the trainer did not provide it."""
        value = self.signals.get(name)
        if value is None:
            raise ValueError(f"{method} needs the signal `{name}`, and the trainer did not provide it")
        return value

    def need(self, name: str, method: str) -> Tensor:
        """The per-token signal ``name``, checked: present, ``[N, L]``, finite on every trained token (the error
        names the batch position)."""
        tensor = self.signals.get(name)
        if tensor is None:
            raise ValueError(f"{method} needs `{name}` per token, and the trainer did not provide it")
        if tuple(tensor.shape) != tuple(self.shape):
            raise ValueError(f"`{name}` has shape {tuple(tensor.shape)}, expected {tuple(self.shape)}")
        finite_where(tensor, name, self.trained_mask())
        return tensor

    def per_episode(self, name: str, method: str) -> Sequence[Any]:
        """The per-episode signal ``name``, checked: present, one entry per episode."""
        values = self.signal(name, method)
        if len(values) != len(self.episodes):
            raise ValueError(f"`{name}` has {len(values)} entries for {len(self.episodes)} episodes")
        return values

    def last_step(self, j: int, method: str) -> Step:
        """Episode j's last step; a ValueError naming it when it has none (an empty first generation)."""
        ep = self.episodes[j]
        if not ep.steps:
            raise ValueError(
                f"episode {j} (group {ep.group!r}) has no policy step; {method} needs one to carry its outcome"
            )
        return ep.steps[-1]

    def tree(self, group: Hashable, method: str) -> DecisionTree:
        try:
            return self.trees[group]
        except KeyError:
            raise ValueError(f"{method} needs the decision tree of group {group!r}") from None

    def zeros(self, dtype: torch.dtype | None = None) -> Tensor:
        return torch.zeros(self.shape, dtype=dtype or self.dtype)

    def trained_mask(self) -> Tensor:
        mask = torch.zeros(self.shape, dtype=torch.bool)
        for ep in self.episodes:
            for s in ep.steps:
                mask[s.row, s.start : s.end] = True
        return mask

    def rewards_per_step(self) -> list[list[float]]:
        """The reward on each step: ``step_rewards`` when shaping set them, else :meth:`environment_rewards`."""
        if self.step_rewards is not None:
            return self.step_rewards
        return self.environment_rewards()

    def environment_rewards(self) -> list[list[float]]:
        """Each step's environment reward, and on the last step the rest of the episode's reward (its outcome):
        a step's reward where the environment gave it, the sum over the steps the episode's reward."""
        out = []
        for ep in self.episodes:
            rewards = [s.env_reward for s in ep.steps]
            if rewards:
                rewards[-1] += outcome_part(ep)
            out.append(rewards)
        return out

    def token_index(self) -> list[tuple[Tensor, Tensor]]:
        """Per episode: (rows, cols) of its trained tokens in temporal order."""
        out = []
        for ep in self.episodes:
            rows = [torch.full((s.length,), s.row, dtype=torch.long) for s in ep.steps]
            cols = [torch.arange(s.start, s.end, dtype=torch.long) for s in ep.steps]
            empty = torch.zeros(0, dtype=torch.long)
            out.append((torch.cat([empty, *rows]), torch.cat([empty, *cols])))
        return out

    def gather(self, tokens: Tensor, index: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """``[N, L]`` -> ``[episodes, T]`` along each episode's trained tokens, and the mask of real entries."""
        width = max((len(r) for r, _ in index), default=1)
        out = torch.zeros(len(index), width, dtype=tokens.dtype)
        mask = torch.zeros(len(index), width, dtype=torch.bool)
        for j, (r, c) in enumerate(index):
            out[j, : len(r)] = tokens[r, c]
            mask[j, : len(r)] = True
        return out, mask

    def scatter(self, per_episode: Tensor, index: list[tuple[Tensor, Tensor]]) -> Tensor:
        """Inverse of :meth:`gather` (0 off the trained tokens)."""
        out = torch.zeros(self.shape, dtype=per_episode.dtype)
        for j, (r, c) in enumerate(index):
            out[r, c] = per_episode[j, : len(r)]
        return out

    def paint_steps(self, per_step: Sequence[Sequence[float]], out: Tensor) -> Tensor:
        """Write one value per step onto the step's tokens."""
        for ep, values in zip(self.episodes, per_step, strict=True):
            if len(values) != len(ep.steps):
                raise ValueError(f"{len(values)} step values for an episode of {len(ep.steps)} steps")
            for s, v in zip(ep.steps, values, strict=True):
                out[s.row, s.start : s.end] = v
        return out


@dataclass
class Estimate:
    """Per-token advantages, the tokens that enter the loss, and (critic methods) the value targets."""

    advantages: Tensor
    loss_mask: Tensor
    returns: Tensor | None = None
    value_mask: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)
    # the advantage as a sum of terms the loss clips each in its own min (PORTool's split min, App. B): their sum
    # is ``advantages``; None = one min on ``advantages`` (every other method, and PORTool's single_min)
    parts: tuple[Tensor, ...] | None = None


def chain_trees(
    episodes: Sequence[Episode],
    step_keys: Sequence[Sequence[Hashable] | None] | None = None,
    fork_counts: Mapping[Hashable, Mapping[Hashable, int]] | None = None,
) -> tuple[list[Episode], dict[Hashable, DecisionTree]]:
    """The decision tree of each group from its episodes' steps, each episode a path under the prompt.

    ``step_keys``: per episode, one key per step (or None). Steps of one group with the same key are one node: the
    shared steps of a rollout tree's branches (verl's tree rollouts key them by tree and node id). A step without
    a key is a node of its own, so independent episodes are chains and the prompt is their only fork.

    ``fork_counts``: per group, the times each state was forked (carl-critical's ``forked_parent`` rule), keyed by
    the step key of the action before the state, or None for the prompt.

    Returns the episodes with their steps' node ids set, and the trees.
    """
    if step_keys is not None and len(step_keys) != len(episodes):
        raise ValueError(f"step_keys has {len(step_keys)} entries for {len(episodes)} episodes")
    parents: dict[Hashable, list[int]] = {}
    known: dict[Hashable, dict[Hashable, int]] = {}
    out = []
    for j, ep in enumerate(episodes):
        tree = parents.setdefault(ep.group, [-1])
        nodes = known.setdefault(ep.group, {})
        keys = step_keys[j] if step_keys is not None else None
        if keys is not None and len(keys) != len(ep.steps):
            raise ValueError(f"episode {j}: {len(keys)} step keys for {len(ep.steps)} steps")
        steps, parent = [], 0
        for k, s in enumerate(ep.steps):
            key = keys[k] if keys is not None else None
            node = nodes.get(key) if key is not None else None
            if node is None:
                tree.append(parent)
                node = len(tree) - 1
                if key is not None:
                    nodes[key] = node
            elif tree[node] != parent:
                raise ValueError(
                    f"episode {j} step {k}: key {key!r} follows two different steps in group {ep.group!r}"
                )
            parent = node
            steps.append(replace(s, node=node))  # every other field kept, whatever fields a Step grows
        out.append(replace(ep, steps=tuple(steps)))
    trees = {}
    for g, p in parents.items():
        counts = None
        if fork_counts is not None and g in fork_counts:
            counts = {}
            for key, c in fork_counts[g].items():
                if key is not None and key not in known[g]:
                    raise ValueError(
                        f"fork_counts of group {g!r} name step key {key!r}, which no episode has"
                    )
                node = 0 if key is None else known[g][key]
                counts[node] = counts.get(node, 0) + int(c)
        trees[g] = DecisionTree(tuple(p), counts)
    return out, trees


# ------------------------------------------------------------------------------------------------ helpers
def episode_groups(batch: EpisodeBatch) -> dict[Hashable, list[int]]:
    """Group -> the indices of its episodes, in batch order."""
    groups: dict[Hashable, list[int]] = {}
    for j, ep in enumerate(batch.episodes):
        groups.setdefault(ep.group, []).append(j)
    return groups


def leaf_rewards(
    batch: EpisodeBatch, members: list[int], method: str, value: Callable[[Episode], float] | None = None
) -> dict[int, float]:
    """Leaf node -> the reward (``value``, default the episode's reward) of the one episode of ``members`` that
    ends there; two episodes ending at one node is an error naming both."""
    leaves: dict[int, int] = {}  # leaf node -> the episode that ends there
    for j in members:
        leaf = batch.last_step(j, method).node
        if leaf in leaves:
            raise ValueError(
                f"{method}: episodes {leaves[leaf]} and {j} of group {batch.episodes[j].group!r} end at the same "
                f"step node {leaf} (rows {batch.episodes[leaves[leaf]].steps[-1].row} and "
                f"{batch.episodes[j].steps[-1].row})"
            )
        leaves[leaf] = j
    value = value or (lambda ep: ep.reward)
    return {leaf: value(batch.episodes[j]) for leaf, j in leaves.items()}
