"""Rollout strategies: which episodes the engine runs for one prompt, as a plan over a growing tree.

* :func:`independent` ``(n)``: n episodes from the prompt (GRPO, PPO, carl-segment, tips, gear).
* :func:`entropy_guided` ``(n0, n, t_max)``: carl-critical's uncertainty-guided progressive forking
  (carl-critical-actions.md 3.5-3.6, Algorithm 1): n0 episodes, then n forks, one at a time per prompt, each
  from the state of lowest action density n(s) / H(s), i.e. the largest H(s) / n(s); at most t_max actions
  per episode (carl-critical-actions.md §2.1, T_max).
* :func:`step_forks` ``(n, f, t_max)``: PORTool's tree rollout (portool.md 2.7-2.8, Algorithm 1): n first steps,
  then per depth DupAndSamp keeps exactly n - n_c unfinished paths; dropped paths are pruned.

A plan is a generator (see :class:`~agentcredit.rollout.engine.Strategy`): it yields jobs, receives their
results, and may return a replacement tree. The selection rules are pure functions (:func:`select_forks`,
:func:`dup_and_samp`, :func:`merge_identical_siblings`) so they can be tested by hand. Plans of different
prompts run concurrently in one engine batch; within a prompt, entropy-guided forks are sequential (each fork
sees the entropies of the previous ones, note (iv) of carl-critical-actions.md §3.6).

Tree vocabulary used here: a *state* is a node a policy segment was generated from (the prompt, an
observation, or a policy node followed directly by another policy segment); an *action* is a policy segment,
its state is its parent node. Depth budgets count actions from the root (carl-critical note (v)).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentcredit.rollout.engine import Job, JobResult, Plan, PlanContext, Strategy
from agentcredit.rollout.tree import RolloutTree

if TYPE_CHECKING:
    from agentcredit.config import TreeStrategyConfig

# ---------------------------------------------------------------------------------------------------------
# independent


class Independent(Strategy):
    """``n`` independent episodes per prompt, sharing the prompt's prefill."""

    name = "independent"

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"independent: n must be >= 1, got {n}")
        self.n = n

    def plan(self, ctx: PlanContext) -> Plan:
        yield [Job(0) for _ in range(self.n)]
        return None


def independent(n: int) -> Independent:
    """n independent episodes from the prompt (a GRPO group)."""
    return Independent(n)


# ---------------------------------------------------------------------------------------------------------
# entropy-guided forking (carl-critical)


def action_entropy(logprobs: Sequence[float]) -> float:
    """h(Y) = -(1/|Y|) sum_j log pi(y_j | ...): the length-normalised NLL of the sampled action (Eq. 8)."""
    if not logprobs:
        raise ValueError("action_entropy: an action needs at least one token")
    return -sum(logprobs) / len(logprobs)


@dataclass
class ForkRecord:
    """One candidate state: the running mean H of its actions' entropies, n(s) its number of children,
    and its depth in actions from the root (for tie-breaking and the T_max rule)."""

    entropy: float
    count: int
    depth: int

    def add(self, h: float) -> None:
        """Algorithm 1 line 18: H <- (h + H * n) / (n + 1); n <- n + 1."""
        self.entropy = (h + self.entropy * self.count) / (self.count + 1)
        self.count += 1


def update_records(records: dict[int, ForkRecord], tree: RolloutTree, new_nodes: Sequence[int]) -> None:
    """Add the actions among ``new_nodes`` to the records of their states (a new state gets (h, 1)).

    The root visited n0 times in phase 1 ends up as one record with n = n0 and H = the mean of the n0
    first-action entropies (carl-critical-actions.md §3.6 note (ii)).
    """
    for node in new_nodes:
        seg = tree.segment(node)
        if seg.role != "policy":
            continue
        if seg.logprobs is None:
            raise ValueError(
                f"node {node}: policy segment without logprobs; cannot compute its action entropy"
            )
        state = tree.parent(node)
        h = action_entropy(seg.logprobs)
        if state in records:
            records[state].add(h)
        else:
            records[state] = ForkRecord(h, 1, action_depth(tree, state))


def action_depth(tree: RolloutTree, node: int) -> int:
    """Number of policy segments on the path from the root to ``node`` (inclusive)."""
    return sum(1 for i in tree.path(node) if tree.segment(i).role == "policy")


def select_forks(
    records: Mapping[int, ForkRecord],
    k: int = 1,
    *,
    max_depth: int | None = None,
    rng: random.Random | None = None,
    uniform: bool = False,
) -> list[int]:
    """The next ``k`` fork states (carl-critical 3.5).

    Priority H / n (the inverse of the density n / H; H = 0 gives priority 0, never a division by H); ties go
    to the smaller depth, then the earlier node (smaller id). States at depth >= ``max_depth`` cannot act and
    are never chosen. With ``k > 1`` (the optional ``forks_per_round`` speed deviation) each pick gets a
    virtual n + 1 before the next pick, so a state can be picked twice. ``uniform=True`` is the random-fork
    ablation (Table 4 #2): uniform over the candidates, with ``rng``.
    """
    live = {s: r for s, r in records.items() if max_depth is None or r.depth < max_depth}
    if not live:
        return []
    if uniform:
        if rng is None:
            raise ValueError("select_forks: the random-fork ablation needs an rng")
        ordered = sorted(live)
        return [rng.choice(ordered) for _ in range(k)]
    virtual = {s: r.count for s, r in live.items()}
    picks = []
    for _ in range(k):
        best = max(live, key=lambda s: (live[s].entropy / virtual[s], -live[s].depth, -s))
        picks.append(best)
        virtual[best] += 1
    return picks


class EntropyGuided(Strategy):
    """carl-critical's progressive forking; see :func:`entropy_guided`."""

    name = "entropy_guided"
    needs_prefix_store = True

    def __init__(
        self,
        n0: int,
        n: int,
        *,
        t_max: int | None = None,
        random_fork: bool = False,
        forks_per_round: int = 1,
    ):
        if n0 < 1 or n < 0:
            raise ValueError(f"entropy_guided: need n0 >= 1 and n >= 0, got n0={n0}, n={n}")
        if t_max is not None and t_max < 1:
            raise ValueError(f"entropy_guided: t_max must be >= 1, got {t_max}")
        if forks_per_round < 1:
            raise ValueError(f"entropy_guided: forks_per_round must be >= 1, got {forks_per_round}")
        self.n0, self.n, self.t_max = n0, n, t_max
        self.random_fork = random_fork
        self.forks_per_round = forks_per_round

    def plan(self, ctx: PlanContext) -> Plan:
        tree = ctx.tree
        # T_max, the action cap of every episode (forks included: depth counts actions from the root)
        t_max = min(self.t_max or ctx.max_turns, ctx.max_turns)
        records: dict[int, ForkRecord] = {}
        results = yield [Job(0, max_turns=t_max) for _ in range(self.n0)]  # phase 1: n0 full episodes
        for result in results:
            update_records(records, tree, result.nodes)
        fork_counts: dict[int, int] = {}
        done, rounds = 0, 1  # phase 1 is one round
        while done < self.n:  # phase 2: n forks
            k = min(self.forks_per_round, self.n - done)
            picks = select_forks(records, k, max_depth=t_max, rng=ctx.rng, uniform=self.random_fork)
            if not picks:
                break  # every state is terminal (cannot happen with n0 >= 1 unless all episodes ended at once)
            results = yield [Job(state, max_turns=t_max) for state in picks]
            rounds += 1
            for result in results:
                update_records(records, tree, result.nodes)
            for state in picks:
                fork_counts[state] = fork_counts.get(state, 0) + 1
            done += len(picks)
        # for the credit step: which states were selected in phase 2 (carl-critical A1's "forked_parent" rule)
        tree.info["fork_counts"] = {str(s): c for s, c in sorted(fork_counts.items())}
        tree.info["n0"], tree.info["n_forks"], tree.info["t_max"] = self.n0, done, t_max
        tree.info["rounds"] = rounds  # sequential generation rounds: 1 + ceil(N / forks_per_round)
        return None


def entropy_guided(
    n0: int,
    n: int,
    t_max: int | None = None,
    *,
    random_fork: bool = False,
    forks_per_round: int = 1,
) -> EntropyGuided:
    """carl-critical Algorithm 1: n0 episodes, then n forks from the largest H(s)/n(s) (tree: n0 + n leaves).

    ``t_max``: at most this many actions per episode, counted from the root, so a fork continues a path only
    up to the same cap (carl-critical-actions.md §2.1: an episode ends at an answer or at T_max; paper: 10 for the 4B runs, else
    32); None or a larger value = the engine's turn cap. States at depth t_max are never forked.
    ``random_fork``: the random-forking ablation. ``forks_per_round > 1``: a documented speed deviation
    (carl-critical-actions.md §3.6 note (iv)), off by default: k forks per round with virtual counts, instead of one at a time.
    """
    return EntropyGuided(n0, n, t_max=t_max, random_fork=random_fork, forks_per_round=forks_per_round)


# ---------------------------------------------------------------------------------------------------------
# PORTool


def dup_and_samp(n_paths: int, f: int, n_select: int, rng: random.Random) -> list[int]:
    """DupAndSamp (portool Algorithm 1): copy each of ``n_paths`` paths ``f`` times, draw ``n_select`` copies
    uniformly without replacement (portool.md [R]: Algorithm 1's select-then-generate); return copies per path."""
    if n_paths < 0 or f < 1 or not 0 <= n_select <= n_paths * f:
        raise ValueError(f"dup_and_samp: need 0 <= n_select <= n_paths * f, got {n_paths=} {f=} {n_select=}")
    counts = [0] * n_paths
    for copy_index in rng.sample(range(n_paths * f), n_select):
        counts[copy_index // f] += 1
    return counts


class StepForks(Strategy):
    """PORTool's tree rollout (every open path forks at every step); see :func:`step_forks`."""

    name = "step_forks"

    def __init__(self, n: int, f: int = 2, t_max: int | None = None, *, merge_identical: bool = True):
        if n < 1 or f < 1:
            raise ValueError(f"step_forks: need n >= 1 and f >= 1, got n={n}, f={f}")
        if t_max is not None and t_max < 1:
            raise ValueError(f"step_forks: t_max must be >= 1, got {t_max}")
        self.n, self.f, self.t_max = n, f, t_max
        self.merge_identical = merge_identical

    def plan(self, ctx: PlanContext) -> Plan:
        tree, rng = ctx.tree, ctx.rng
        t_max = min(self.t_max or ctx.max_turns, ctx.max_turns)
        completed: list[int] = []
        results = yield [Job(0, max_steps=1, max_turns=t_max) for _ in range(self.n)]  # lines 2-8
        active: list[int] = []
        for t in range(2, t_max + 2):
            for result in results:  # lines 11-16: finished paths leave the pool
                (completed if result.finished else active).append(result.end)
            if not active or t > t_max:  # line 18 (n_c = n), or the depth cap
                break
            counts = dup_and_samp(len(active), self.f, len(active), rng)  # line 22, N = n - n_c
            jobs = [
                Job(node, max_steps=1, max_turns=t_max)
                for node, c in zip(active, counts, strict=True)
                for _ in range(c)
            ]
            active = []
            results = yield jobs  # lines 23-26
        if active:  # cannot happen: the turn cap t_max ends every path at depth t_max
            raise RuntimeError(f"step_forks: {len(active)} paths still open after t_max={t_max} (engine bug)")
        if len(completed) != self.n:
            raise RuntimeError(
                f"step_forks: {len(completed)} trajectories instead of n={self.n} (engine bug)"
            )
        completed.sort()  # trajectory j = the j-th kept leaf in node order
        pruned, mapping = tree.prune(completed)  # drop the paths DupAndSamp did not continue
        trajectories = [mapping[leaf] for leaf in completed]
        _set_trajectories(pruned, trajectories)
        pruned.info.update(
            {"n": self.n, "f": self.f, "t_max": t_max, "pruned_nodes": len(tree) - len(pruned)}
        )
        if self.merge_identical:
            merged, _ = merge_identical_siblings(pruned)
            _set_trajectories(merged, merged.leaves())  # leaves never merge: still the n trajectories
            merged.info["merged_nodes"] = len(pruned) - len(merged)
            return merged
        return pruned


def step_forks(n: int, f: int = 2, t_max: int | None = None, *, merge_identical: bool = True) -> StepForks:
    """PORTool Algorithm 1 with n trajectories and branching factor f (portool.md default f = 2), depth cap t_max
    (None: the engine's turn cap; portool.md [R] 6). ``merge_identical`` merges byte-identical sibling steps
    (portool.md §2.8 step 3, default on).

    The returned tree is pruned to the n kept trajectories: its n leaves, in node order, are the trajectories
    (``tree.info["trajectories"]``), and every node's ``info["traj_ids"]`` is m(v), the trajectories through it.
    """
    return StepForks(n, f, t_max, merge_identical=merge_identical)


def _set_trajectories(tree: RolloutTree, leaves: Sequence[int]) -> None:
    tree.info["trajectories"] = list(leaves)
    for node in tree.nodes:
        node.info.pop("traj_ids", None)
    for j, leaf in enumerate(leaves):
        for node in tree.path(leaf):
            tree.nodes[node].info.setdefault("traj_ids", []).append(j)


def _step_key(tree: RolloutTree, node: int) -> tuple:
    """What must be byte-identical for two siblings to merge: the segment, and for a policy segment the
    observation(s) that followed it (so a merged node has one well-defined context). A leaf's key is unique:
    leaves never merge (see :func:`merge_identical_siblings`)."""
    if tree.is_leaf(node):
        return ("leaf", node)
    seg = tree.segment(node)
    observations = tuple(
        tuple(tree.segment(c).token_ids) for c in tree.children(node) if tree.segment(c).role == "observation"
    )
    # a per-episode environment's step reward too: merged siblings must have earned the same
    return (seg.role, seg.kind, tuple(seg.token_ids), seg.transient, observations, seg.info.get("env_reward"))


def merge_identical_siblings(tree: RolloutTree) -> tuple[RolloutTree, dict[int, int]]:
    """A tree where sibling steps with identical tokens and observations are one node (portool 2.8 step 3).

    Returns the new tree and the map old id -> new id. Merging is applied top-down, so the children of merged
    nodes are compared with each other too. Leaves are never merged (a deviation from portool.md §2.8 (4), which
    allows |m(leaf)| > 1): every leaf stays one of the n trajectories with its own outcome reward, which is
    what the tree contract and ``agentcredit.credit.methods.portool`` (m(v) = the leaves under v) rely on.
    """
    new = RolloutTree(tree.root.segment, prompt_id=tree.prompt_id, info=dict(tree.info))
    mapping = {0: 0}

    def visit(olds: list[int], new_parent: int) -> None:
        groups: dict[tuple, list[int]] = {}
        for old in olds:
            for child in tree.children(old):
                groups.setdefault(_step_key(tree, child), []).append(child)
        for members in groups.values():
            first = tree.nodes[members[0]]
            node_id = new.add(first.segment, new_parent, info=dict(first.info))
            new.nodes[node_id].reward = first.reward
            if len(members) > 1:
                new.nodes[node_id].info["merged_from"] = list(members)
            for m in members:
                mapping[m] = node_id
            visit(members, node_id)

    visit([0], 0)
    return new, mapping


__all__ = [
    "EntropyGuided",
    "ForkRecord",
    "Independent",
    "JobResult",
    "StepForks",
    "action_depth",
    "action_entropy",
    "dup_and_samp",
    "entropy_guided",
    "from_rollout_config",
    "independent",
    "merge_identical_siblings",
    "select_forks",
    "step_forks",
    "update_records",
]


def from_rollout_config(rollout: TreeStrategyConfig) -> Independent | EntropyGuided | StepForks:
    """The strategy ``config.rollout`` names (``independent``, ``entropy_guided`` or ``step_forks``), with its sizes."""
    if rollout.strategy == "independent":
        return independent(rollout.n)
    if rollout.strategy == "entropy_guided":
        return entropy_guided(
            rollout.n0,
            rollout.n,
            rollout.t_max,
            random_fork=rollout.random_forks,
            forks_per_round=rollout.forks_per_round,
        )
    if rollout.strategy == "step_forks":
        return step_forks(rollout.n, rollout.branch, rollout.t_max)
    raise ValueError(f"rollout.strategy: unknown strategy {rollout.strategy!r}")
