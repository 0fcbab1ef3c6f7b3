"""The credit estimators, each declared once, computed from a neutral per-episode layout both trainers build.

The native trainer (:mod:`agentcredit.train.advantages`) lays out its rollout trees, the verl adapter
(:mod:`agentcredit.integrations.verl.advantages`) lays out verl's rows; both build an :class:`EpisodeBatch` and
call the same parts, in this order:

1. shaping (optional) — :func:`tips_step_rewards` puts TIPS turn rewards on the steps;
2. the estimator — the :data:`ESTIMATORS` entry a method's preset names (:mod:`agentcredit.credit.registry`);
3. reweighting (optional) — :func:`gear_reweight` multiplies the estimator's advantages by GEAR's weight.

What stays with each trainer is what differs between them: where a critic target goes (verl's value loss reads
every response token), advantage whitening, and how a loss aggregation is expressed. An entry only routes data:
every number comes from a credit function of this package.

**Layout.** Token coordinates are ``(row, column)`` of the caller's ``[N, L]`` tensors. An :class:`Episode`
lists its policy segments ("steps") in temporal order, each trained at the columns ``[start, end)`` of one row;
the episode's trained tokens are its steps' tokens, in step order (this is what lets carl-segment's replacement
mode spread an episode over several rows). Steps carry a node id in their group's :class:`DecisionTree`
(node 0 is the prompt): episodes that share a tree prefix share the node, and independent episodes are chains
under the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import Tensor

from agentcredit.credit._validate import finite_where
from agentcredit.credit.carl_critical import critical_action_advantages
from agentcredit.credit.carl_segment import segment_advantages
from agentcredit.credit.gae import gae_advantages
from agentcredit.credit.gear import gear_advantages, gear_details
from agentcredit.credit.gigpo import gigpo_advantages
from agentcredit.credit.grpo import grpo_advantages
from agentcredit.credit.portool import portool_advantage_terms
from agentcredit.credit.tips import tips_turn_rewards

__all__ = [
    "ESTIMATORS",
    "DecisionTree",
    "Episode",
    "EpisodeBatch",
    "Estimate",
    "Estimator",
    "Step",
    "chain_trees",
    "gear_reweight",
    "gear_reweight_stats",
    "tips_step_rewards",
]


@dataclass(frozen=True)
class Step:
    """One policy segment of an episode, trained at columns ``[start, end)`` of batch row ``row``."""

    row: int
    start: int
    end: int
    node: int = 0  # its node in the group's decision tree (carl-critical, portool)
    anchor: tuple[Hashable, ...] = ()  # gigpo: the tokens before the step
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
    # TIPS: the steps that end tool turns k = 1..M; None = every step but the last (each is followed by a tool
    # output in the native protocols)
    turn_ends: tuple[int, ...] | None = None
    potentials: tuple[float, ...] | None = None  # TIPS: Phi(S_0), ..., Phi(S_M)

    def tool_turn_ends(self) -> tuple[int, ...]:
        return tuple(range(len(self.steps) - 1)) if self.turn_ends is None else self.turn_ends


@dataclass(frozen=True)
class DecisionTree:
    """A group's steps as a tree: ``parents[i]`` is the parent of node i, -1 for node 0 (the prompt)."""

    parents: tuple[int, ...]
    fork_counts: Mapping[int, int] | None = None  # carl-critical's forked_parent rule: forks per node


def outcome_part(ep: Episode) -> float:
    """The episode's reward minus its environment step rewards: the outcome (all of it without an environment)."""
    env = sum(s.env_reward for s in ep.steps)
    return ep.reward - env if env else ep.reward


@dataclass
class EpisodeBatch:
    """A batch of episodes and the per-token signals the estimators may read (``[N, L]``, None = absent)."""

    shape: tuple[int, int]
    episodes: list[Episode]
    trees: Mapping[Hashable, DecisionTree] = field(default_factory=dict)
    values: Tensor | None = None  # V(state before token)
    student_logp: Tensor | None = None  # GEAR: the sampled tokens' log-probs
    teacher_logp: Tensor | None = (
        None  # GEAR: the same tokens' log-probs under the answer-conditioned context
    )
    entropy: Tensor | None = None  # GEAR: the student's entropy
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

    def need(self, name: str, method: str) -> Tensor:
        """The per-token signal ``name``, checked: present, ``[N, L]``, finite on every trained token (the error
        names the batch position)."""
        tensor = getattr(self, name)
        if tensor is None:
            raise ValueError(f"{method} needs `{name}` per token, and the trainer did not provide it")
        if tuple(tensor.shape) != tuple(self.shape):
            raise ValueError(f"`{name}` has shape {tuple(tensor.shape)}, expected {tuple(self.shape)}")
        finite_where(tensor, name, self.trained_mask())
        return tensor

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
            steps.append(Step(s.row, s.start, s.end, node, s.anchor, s.format_reward, s.env_reward))
        out.append(Episode(ep.group, ep.reward, tuple(steps), ep.turn_ends, ep.potentials))
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


# ------------------------------------------------------------------------------------------------ shaping
def tips_step_rewards(
    batch: EpisodeBatch,
    *,
    alpha: float,
    no_tool_shaping: str = "paper",
    terminal_potential: str = "zero",
) -> list[list[float]]:
    """TIPS turn rewards per step: turn k's on the step that ends it, the final reward on the last step.

    ``alpha [Phi(S_k) - Phi(S_{k-1})]`` for k = 1..M, then the outcome minus ``alpha Phi(S_M)`` (Eqs. 17-20).
    Assign the result to ``batch.step_rewards``; GAE then reads it off the steps' last tokens and carl-segment
    adds it to each segment's TD error.
    """
    out = []
    for j, ep in enumerate(batch.episodes):
        ends = ep.tool_turn_ends()
        if ep.potentials is None:
            raise ValueError(f"episode {j}: tips needs the teacher potentials Phi(S_0..S_M)")
        if len(ep.potentials) != len(ends) + 1:
            raise ValueError(
                f"episode {j}: {len(ep.potentials)} potentials for {len(ends)} tool turns (needs M + 1)"
            )
        turn = tips_turn_rewards(
            list(ep.potentials),
            outcome_part(ep),
            alpha=alpha,
            no_tool_shaping=no_tool_shaping,  # type: ignore[arg-type]
            terminal_potential=terminal_potential,  # type: ignore[arg-type]
        )
        batch.last_step(j, "tips")
        rewards = [s.env_reward for s in ep.steps]
        for step, r in zip(ends, turn[:-1], strict=True):
            rewards[step] += r
        rewards[-1] += turn[-1]
        out.append(rewards)
    return out


# ------------------------------------------------------------------------------------------------ estimators
def _grpo(batch: EpisodeBatch, *, eps: float = 1e-6, scale: bool = True) -> Estimate:
    rewards = torch.tensor([ep.reward for ep in batch.episodes], dtype=torch.float64)
    per_episode = grpo_advantages(rewards, [ep.group for ep in batch.episodes], eps=eps, scale=scale)
    per_step = [
        [float(a)] * len(ep.steps) for ep, a in zip(batch.episodes, per_episode.tolist(), strict=True)
    ]
    return Estimate(batch.paint_steps(per_step, batch.zeros()), batch.trained_mask())


def _gae(batch: EpisodeBatch, *, gamma: float = 1.0, lam: float = 1.0) -> Estimate:
    values = batch.need("values", "gae")
    index = batch.token_index()
    rewards = batch.zeros()
    for j, (ep, step_rewards) in enumerate(zip(batch.episodes, batch.rewards_per_step(), strict=True)):
        batch.last_step(j, "gae")
        for s, r in zip(ep.steps, step_rewards, strict=True):
            rewards[s.row, s.end - 1] += r
    rew, mask = batch.gather(rewards, index)
    val, _ = batch.gather(values.to(batch.dtype), index)
    adv, ret = gae_advantages(rew, val, mask, gamma=gamma, lam=lam)
    trained = batch.trained_mask()
    return Estimate(batch.scatter(adv, index), trained, batch.scatter(ret, index), trained.clone())


def _segment(batch: EpisodeBatch, *, lam: float = 0.0, gamma: float = 1.0) -> Estimate:
    values = batch.need("values", "segment")
    per_step = []
    returns = batch.zeros()
    value_mask = torch.zeros(batch.shape, dtype=torch.bool)
    unshaped = batch.environment_rewards()
    for j, (ep, rewards) in enumerate(zip(batch.episodes, batch.rewards_per_step(), strict=True)):
        batch.last_step(j, "segment")
        boundary = [float(values[s.row, s.start]) for s in ep.steps]
        # rewards[-1] is the outcome (minus alpha Phi(S_M) under TIPS shaping); the others are turn rewards
        per_step.append(
            segment_advantages(boundary, rewards[-1], lam=lam, gamma=gamma, segment_rewards=rewards[:-1])
        )
        for k, s in enumerate(ep.steps):
            value_mask[s.row, s.start] = True
            # Monte-Carlo target at every boundary (carl-segment.md §3.5): the reward still to come, which is the
            # episode's reward unless an environment paid part of it at earlier steps
            returns[s.row, s.start] = sum(unshaped[j][k:])
    adv = batch.paint_steps(per_step, batch.zeros())
    return Estimate(adv, batch.trained_mask(), returns=returns, value_mask=value_mask)


def _groups(batch: EpisodeBatch) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for j, ep in enumerate(batch.episodes):
        groups.setdefault(ep.group, []).append(j)
    return groups


def _leaf_rewards(
    batch: EpisodeBatch, members: list[int], method: str, value: Callable[[Episode], float] | None = None
) -> dict[int, float]:
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


def _critical(batch: EpisodeBatch, *, update_rule: str = "multi_child") -> Estimate:
    adv = batch.zeros()
    loss_mask = torch.zeros(batch.shape, dtype=torch.bool)
    rolled = updated = 0
    groups = _groups(batch)
    for group, members in groups.items():
        tree = batch.tree(group, "carl-critical")
        kwargs = {"fork_counts": dict(tree.fork_counts or {})} if update_rule == "forked_parent" else {}
        _, node_adv, update = critical_action_advantages(
            list(tree.parents),
            _leaf_rewards(batch, members, "carl-critical"),
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


def _portool(
    batch: EpisodeBatch,
    *,
    gamma: float = 0.95,
    w1: float = 1.0,
    root_is_fork: bool = False,
    combine: str = "split_min",
    outcome_shift: float = 0.0,
) -> Estimate:
    """PORTool Eqs. 1-3 per query tree; with ``combine="split_min"`` (App. B, the default) the Estimate also
    carries the trajectory and fork terms as two advantages, each clipped in its own min by the loss.

    Statistics (per step, ``portool/*``): the share of trees with no correct trajectory (no R_out >= 1, the
    judge's "true") and the share of the batch's |advantage| (summed over trained tokens, as the loss sees them)
    that lies in those trees. In the PORTool study 13 of 16 step-1 trajectories were wrong, and in such trees
    Eq. 2's decay on the -1 outcome plus the sibling z-score credited searching again: these show that regime.
    """
    if combine not in ("single_min", "split_min"):
        raise ValueError(f"portool combine must be 'single_min' or 'split_min', got {combine!r}")
    per_step: list[list[float]] = [[] for _ in batch.episodes]
    trj_step: list[list[float]] = [[] for _ in batch.episodes]
    fork_step: list[list[float]] = [[] for _ in batch.episodes]
    groups = _groups(batch)
    failing_trees = 0
    abs_all = abs_failing = 0.0
    for group, members in groups.items():
        tree = batch.tree(group, "portool")
        lengths = [0] * len(tree.parents)
        fmt = [0.0] * len(tree.parents)
        for j in members:
            for s in batch.episodes[j].steps:
                lengths[s.node] = s.length
                fmt[s.node] = s.format_reward + s.env_reward  # an environment's step reward is R_fm's peer
        # the outcome alone: an environment's step rewards enter R_fm(v) above, so none counts twice
        outcomes = _leaf_rewards(batch, members, "portool", outcome_part)
        terms = portool_advantage_terms(
            list(tree.parents),
            lengths,
            outcomes,
            fmt,
            gamma=gamma,
            w1=w1,
            root_is_fork=root_is_fork,
            outcome_shift=outcome_shift,
        )
        failing = max(outcomes.values()) < 1.0
        failing_trees += failing
        for j in members:
            leaf = batch.episodes[j].steps[-1].node
            per_step[j] = list(terms.advantages[leaf])
            trj_step[j] = list(terms.trajectory_terms[leaf])
            fork_step[j] = list(terms.fork_terms[leaf])
            mass = sum(abs(a) * s.length for a, s in zip(per_step[j], batch.episodes[j].steps, strict=True))
            abs_all += mass
            abs_failing += mass if failing else 0.0
    stats = {
        "portool/failing_tree_frac": failing_trees / max(len(groups), 1),
        # 0 when no token has an advantage (every tree uniform): nothing is pushed, from failing trees or not
        "portool/failing_abs_adv_share": abs_failing / abs_all if abs_all > 0 else 0.0,
    }
    parts = None
    if combine == "split_min":
        parts = (batch.paint_steps(trj_step, batch.zeros()), batch.paint_steps(fork_step, batch.zeros()))
    adv = batch.paint_steps(per_step, batch.zeros())
    return Estimate(adv, batch.trained_mask(), stats=stats, parts=parts)


def _gigpo(
    batch: EpisodeBatch,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    eps: float = 1e-6,
    scale: bool = True,
) -> Estimate:
    anchors = [[s.anchor for s in ep.steps] for ep in batch.episodes]
    steps = gigpo_advantages(
        [ep.reward for ep in batch.episodes],
        [ep.group for ep in batch.episodes],
        anchors,
        gamma=gamma,
        step_weight=step_weight,
        eps=eps,
        scale=scale,
    )
    sizes: dict[tuple[Hashable, Hashable], int] = {}
    for ep, states in zip(batch.episodes, anchors, strict=True):
        for anchor in states:
            sizes[(ep.group, anchor)] = sizes.get((ep.group, anchor), 0) + 1
    counts = list(sizes.values())
    stats = {  # how often a step has company: with size 1 everywhere GiGPO is GRPO
        "gigpo/step_groups": float(len(counts)),
        "gigpo/grouped_step_fraction": sum(c for c in counts if c > 1) / max(sum(counts), 1),
    }
    adv = batch.paint_steps([v.tolist() for v in steps], batch.zeros())
    return Estimate(adv, batch.trained_mask(), stats=stats)


# ------------------------------------------------------------------------------------------------ reweighting
def gear_reweight(
    batch: EpisodeBatch,
    advantages: Tensor,
    *,
    lambda_kl: float = 0.1,
    lambda_h: float = 1.5,
    alpha: float = 0.2,
    beta: float | None = None,
    normalisation: str = "minmax",
) -> Tensor:
    """GEAR's weight W_t on top of any per-token advantage, along each episode's trained tokens (see
    :func:`gear_reweight_stats`, which also returns the step's segmentation statistics)."""
    return gear_reweight_stats(
        batch,
        advantages,
        lambda_kl=lambda_kl,
        lambda_h=lambda_h,
        alpha=alpha,
        beta=beta,
        normalisation=normalisation,
    )[0]


def gear_reweight_stats(
    batch: EpisodeBatch,
    advantages: Tensor,
    *,
    lambda_kl: float = 0.1,
    lambda_h: float = 1.5,
    alpha: float = 0.2,
    beta: float | None = None,
    normalisation: str = "minmax",
) -> tuple[Tensor, dict[str, float]]:
    """GEAR's weight W_t on top of any per-token advantage, and the statistics that show whether it reweights.

    GEAR's weight depends on the advantage only through its sign, so it is read off :func:`gear_details` at
    A = +1 and A = -1 and applied token by token (for a constant A this is exactly ``gear_advantages(A, ...)``).

    Statistics (spec gear.md §12.4 and A3), over the trained tokens of every episode with one:
    ``gear/trigger_rate`` (share of tokens with r > lambda_KL, before propagation), ``gear/frac_in_segments``
    (share inside a segment) and ``gear/clamp_max_share`` (share of episodes normalised with clamp_max, which
    ``normalisation="auto"`` picks where min-max would trigger on more than 20% of the tokens). The paper
    describes the spikes as sparse; a trigger rate near 1 means min-max has gone flat and W is one constant per
    episode (GEAR becomes a scaled GRPO).
    """
    index = batch.token_index()
    student, mask = batch.gather(batch.need("student_logp", "gear"), index)
    teacher, _ = batch.gather(batch.need("teacher_logp", "gear").to(student.dtype), index)
    entropy, _ = batch.gather(batch.need("entropy", "gear"), index)
    a, _ = batch.gather(advantages, index)
    out = torch.zeros_like(a)
    kw = {
        "lambda_kl": lambda_kl,
        "lambda_h": lambda_h,
        "alpha": alpha,
        "beta": beta,
        "normalisation": normalisation,
    }
    tokens = triggers = in_segments = 0.0
    episodes = clamped = 0
    for j in range(a.shape[0]):
        # each sign's weight only where the episode has that sign (GRPO's A is one sign per episode); the A = +1
        # pass always runs, since its segmentation statistics describe the episode whatever its sign
        pos, neg = bool((a[j] > 0).any()), bool((a[j] < 0).any())
        zero = torch.zeros_like(a[j])
        details = gear_details(1.0, student[j], teacher[j], entropy[j], mask[j], **kw)
        w_pos = details.advantages if pos else zero
        w_neg = -gear_advantages(-1.0, student[j], teacher[j], entropy[j], mask[j], **kw) if neg else zero
        out[j] = torch.where(a[j] > 0, w_pos, w_neg).to(a.dtype) * a[j]
        n = float(mask[j].sum())
        if n:
            tokens += n
            triggers += details.trigger_rate * n
            in_segments += details.frac_in_segments * n
            episodes += 1
            clamped += details.normalisation == "clamp_max"
    stats = {}
    if tokens:
        stats = {
            "gear/trigger_rate": triggers / tokens,
            "gear/frac_in_segments": in_segments / tokens,
            "gear/clamp_max_share": clamped / episodes,
        }
    return batch.scatter(out, index), stats


# ------------------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class Estimator:
    """One estimator: what it reads besides the layout, and the function from the layout to an Estimate."""

    name: str
    compute: Callable[..., Estimate]
    needs: frozenset[str]  # "values" (a critic), "tree" (decision trees), "anchors", "format_rewards"
    source: str

    @property
    def needs_critic(self) -> bool:
        return "values" in self.needs

    def __call__(self, batch: EpisodeBatch, **params: object) -> Estimate:
        return self.compute(batch, **params)


ESTIMATORS: Mapping[str, Estimator] = MappingProxyType(
    {
        e.name: e
        for e in (
            Estimator("grpo", _grpo, frozenset(), "GRPO, Shao et al. 2024 Eq. 3"),
            Estimator("gae", _gae, frozenset({"values"}), "GAE over policy tokens, verl multi-turn GAE"),
            Estimator("segment", _segment, frozenset({"values"}), "carl-segment Eqs. 1, 6"),
            Estimator("critical", _critical, frozenset({"tree"}), "carl-critical Eqs. 9-13"),
            Estimator("portool", _portool, frozenset({"tree", "format_rewards"}), "PORTool Eqs. 1-3"),
            Estimator("gigpo", _gigpo, frozenset({"anchors"}), "GiGPO, Feng et al. 2025"),
        )
    }
)
