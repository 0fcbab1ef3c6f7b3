"""portool: trajectory- plus fork-relative step advantages on a tree that keeps n trajectories.

Paper: "PORTool" (spec ``portool.md`` Sec. 3.3-3.9). Node 0 is the query; every other node is one step s (a
``<think>`` + ``<tool_call>`` generation of |s| policy tokens); the n leaves end the n trajectories tau_k of
T_k steps and |tau_k| = sum of |s| on the path. m(v) = trajectories through v (the leaves under v), C(p) = the
children of p. For every step v with parent p:

Step reward (Eq. 2) with the adaptive aggregator G (spec Sec. 3.3, non-circular reading)::

    vals(v) = [ gamma^(T_k - depth(v)) * R_out(tau_k) + R_fm(v)  for k in m(v) ]
    G = max   if the siblings' max-aggregated values max(vals(c)), c in C(p), are not all equal (atol 1e-6)
    G = avg   otherwise (ties, and only children)               R(v) = G(vals(v))

Trajectory-relative advantage (Sec. 3.4): A_trj(tau_j) = zscore(R_out(tau_j) over the n trajectories).
Fork-relative advantage (Sec. 3.5): A_fork(v) = zscore(R(v) over C(p)) if p is a fork, else 0.
Both z-scores use the unbiased std and eps = 1e-6, and give 0 to a group of one or a group of equal values.

Combined advantage of every token of step v inside trajectory j (Eq. 3, Theorem 3.1)::

    A(j, v) = w1 / |m(v)| * sum_{k in m(v)} A_trj(tau_k)  +  w2(j, v) * A_fork(v)
    w2(j, v) = n * |tau_j| / ( |m(v)| * |s_v| * |C(p)| * N_forks )

A fork is a node with two or more children; N_forks counts the distinct forks. The paper's fork set is
F(q) = {s_{k,t} : |C(s_{k,t})| > 1, k in [n], t in [T_k]} (portool.txt l. 536, Theorem 3.1; App. B l. 1007-1013):
steps from t = 1 on, so the query (the root) is not a fork and a first step gets no fork term. That is the default
here (``root_is_fork=False``); the spec's [R] (portool.md 8.6) counts the root (``root_is_fork=True``), kept as an
option: the paper wins over the spec. The loss must aggregate with ``seq-mean-token-mean`` (Eq. 1), which is what
Theorem 3.1's |tau_j| factor is derived for. The paper's split min (App. B, l. 1034-1044 and remark (i) l. 1142-1143:
"we do not replace A by a single sum inside one min(.)") is the sum of two ``policy_loss`` calls on
:attr:`PortoolTerms.trajectory_terms` and :attr:`PortoolTerms.fork_terms`, since the aggregation is linear; the
estimator hands both to the trainer (``combine="split_min"``, the default, see
:mod:`agentcredit.credit.estimators`).

``outcome_shift`` (default 0, the paper) is a variant that is **not** PORTool: it adds a constant to R_out in
Eq. 2's decay term only, gamma^(T_k - t) * (R_out + shift). With shift = 1 the outcomes {-1, 0, +1} become
{0, 1, 2}: a tree whose trajectories all failed has no outcome part left in its step rewards, so the decay can no
longer favour the longer failing path (under the paper's -1, gamma^(T-t) * -1 is largest for the longest path,
which credits "search again"), while a tree with a success still ranks its siblings. A_trj is a z-score and
does not move with a constant shift.

The formatting-reward cascade and its rescaling R_fm = 0.5 * raw - 0.25 belong to the protocol; this module takes
the rescaled R_fm per step. The gamma = 0 ablation drops the outcome term entirely (the paper: gamma = 0
"disregards trajectory correctness"), rather than keeping leaves' R_out through 0**0 = 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from agentcredit.credit._stats import mean, zscore
from agentcredit.credit._tree import leaf_values, node_floats, parse_tree
from agentcredit.credit._validate import as_int, choice, finite_float, unit_interval

__all__ = ["portool_advantages", "portool_advantage_terms", "PortoolTerms", "AGGREGATORS", "W2_MODES"]

Aggregator = Literal["portool", "max", "avg", "mix2"]
W2Mode = Literal["theorem", "one", "zero"]
AGGREGATORS: tuple[str, ...] = ("portool", "max", "avg", "mix2")
W2_MODES: tuple[str, ...] = ("theorem", "one", "zero")


@dataclass(frozen=True)
class PortoolTerms:
    """Everything :func:`portool_advantage_terms` computes for one query tree (for tests and logging).

    Per-path lists run over the steps of the root-to-leaf path, depth 1 first.
    """

    advantages: dict[int, list[float]]  # leaf -> A(j, v) per step (Eq. 3)
    trajectory_terms: dict[int, list[float]]  # leaf -> w1 * mean_{k in m(v)} A_trj(k)
    fork_terms: dict[int, list[float]]  # leaf -> w2(j, v) * A_fork(v)
    w2: dict[int, list[float]]  # leaf -> w2(j, v) (0 where the parent is not a fork)
    paths: dict[int, list[int]]  # leaf -> node ids of its steps
    step_rewards: list[float]  # node -> R(v) (Eq. 2); 0.0 for the root
    fork_advantages: list[float]  # node -> A_fork(v); 0 when its parent is not a fork
    trajectory_advantages: dict[int, float]  # leaf -> A_trj(tau)
    forks: tuple[int, ...]  # the nodes counted in N_forks
    aggregation: dict[int, str]  # internal node -> "max" or "avg", the G used for its children
    trajectory_lengths: dict[int, int]  # leaf -> |tau| in policy tokens

    @property
    def n_forks(self) -> int:
        return len(self.forks)


def portool_advantage_terms(
    parents: Sequence[int] | Tensor,
    step_lengths: Sequence[int] | Tensor,
    leaf_outcomes: Mapping[int, float],
    format_rewards: Sequence[float] | Tensor,
    *,
    gamma: float = 0.95,
    w1: float = 1.0,
    root_is_fork: bool = False,
    aggregator: Aggregator = "portool",
    w2_mode: W2Mode = "theorem",
    eps: float = 1e-6,
    tie_atol: float = 1e-6,
    outcome_shift: float = 0.0,
) -> PortoolTerms:
    """PORTool step rewards and advantages with every intermediate term (see :func:`portool_advantages`).

    Extra keywords beyond the public contract (the paper's ablations, Sec. 4.3):
        aggregator: G of Eq. 2: ``"portool"`` (adaptive, paper default), ``"max"``, ``"avg"`` or ``"mix2"``
            (G over the outcome part only, R_fm added after; the tie test uses the outcome maxima).
        w2_mode: ``"theorem"`` (Theorem 3.1, paper default), ``"one"`` (w2 = 1 on fork children: the
            "no scale" preset with w1 = 1) or ``"zero"`` (trajectory-only).
        eps: z-score epsilon (verl's 1e-6, spec Sec. 3.4).
        tie_atol: tolerance of the G = max / avg tie test (spec Sec. 3.3, 1e-6).
        outcome_shift: added to R_out inside Eq. 2's decay term (0 = the paper; 1 = the shifted-outcome variant,
            not PORTool; see the module docstring).
    """
    tree = parse_tree(parents)
    outcomes = leaf_values(tree, leaf_outcomes, "leaf_outcomes")
    fm = node_floats(tree, format_rewards, "format_rewards")
    lengths = _step_lengths(step_lengths, len(tree))
    gamma = unit_interval(gamma, "gamma")
    w1 = finite_float(w1, "w1")
    choice(aggregator, "aggregator", AGGREGATORS)
    choice(w2_mode, "w2_mode", W2_MODES)
    eps = finite_float(eps, "eps")
    tie_atol = finite_float(tie_atol, "tie_atol")
    outcome_shift = finite_float(outcome_shift, "outcome_shift")
    if eps < 0 or tie_atol < 0:
        raise ValueError(f"eps and tie_atol must be >= 0, got eps={eps}, tie_atol={tie_atol}")

    leaves = list(tree.leaves)
    n = len(leaves)
    under = tree.leaves_under()  # m(v)
    paths = {leaf: tree.path(leaf) for leaf in leaves}
    traj_len = {leaf: sum(lengths[v] for v in paths[leaf]) for leaf in leaves}
    a_trj = dict(zip(leaves, zscore([outcomes[k] for k in leaves], eps), strict=True))

    def outcome_part(v: int) -> list[float]:
        if gamma == 0.0:  # the gamma = 0 ablation: no outcome term at all (see module docstring)
            return [0.0 for _ in under[v]]
        return [gamma ** (tree.depth[k] - tree.depth[v]) * (outcomes[k] + outcome_shift) for k in under[v]]

    step_reward = [0.0] * len(tree)
    aggregation: dict[int, str] = {}
    for p in tree.order:
        kids = tree.children[p]
        if not kids:
            continue
        out = {v: outcome_part(v) for v in kids}
        vals = {v: [o + fm[v] for o in out[v]] for v in kids}
        if aggregator in ("max", "avg"):
            use_max = aggregator == "max"
        else:
            tie_key = out if aggregator == "mix2" else vals
            maxima = [max(tie_key[v]) for v in kids]
            use_max = len(kids) >= 2 and max(maxima) - min(maxima) > tie_atol
        aggregation[p] = "max" if use_max else "avg"
        for v in kids:
            pool = out[v] if aggregator == "mix2" else vals[v]
            g = max(pool) if use_max else mean(pool)
            step_reward[v] = g + fm[v] if aggregator == "mix2" else g

    def is_fork(p: int) -> bool:
        return len(tree.children[p]) >= 2 and (p != 0 or root_is_fork)

    forks = tuple(p for p in tree.order if is_fork(p))
    fork_adv = [0.0] * len(tree)
    for p in forks:
        kids = tree.children[p]
        for v, z in zip(kids, zscore([step_reward[v] for v in kids], eps), strict=True):
            fork_adv[v] = z

    advantages: dict[int, list[float]] = {}
    trj_terms: dict[int, list[float]] = {}
    fork_terms: dict[int, list[float]] = {}
    w2s: dict[int, list[float]] = {}
    for leaf in leaves:
        adv_row, trj_row, fork_row, w2_row = [], [], [], []
        for v in paths[leaf]:
            p = tree.parents[v]
            m = under[v]
            trj = w1 * mean([a_trj[k] for k in m])
            if not is_fork(p) or w2_mode == "zero":
                w2 = 0.0
            elif w2_mode == "one":
                w2 = 1.0
            else:  # Theorem 3.1; N_forks >= 1 here because p itself is a fork
                w2 = n * traj_len[leaf] / (len(m) * lengths[v] * len(tree.children[p]) * len(forks))
            fork = w2 * fork_adv[v]
            adv_row.append(trj + fork)
            trj_row.append(trj)
            fork_row.append(fork)
            w2_row.append(w2)
        advantages[leaf], trj_terms[leaf], fork_terms[leaf], w2s[leaf] = adv_row, trj_row, fork_row, w2_row

    return PortoolTerms(
        advantages=advantages,
        trajectory_terms=trj_terms,
        fork_terms=fork_terms,
        w2=w2s,
        paths=paths,
        step_rewards=step_reward,
        fork_advantages=fork_adv,
        trajectory_advantages=a_trj,
        forks=forks,
        aggregation=aggregation,
        trajectory_lengths=traj_len,
    )


def portool_advantages(
    parents: Sequence[int] | Tensor,
    step_lengths: Sequence[int] | Tensor,
    leaf_outcomes: Mapping[int, float],
    format_rewards: Sequence[float] | Tensor,
    *,
    gamma: float = 0.95,
    w1: float = 1.0,
    root_is_fork: bool = False,
    aggregator: Aggregator = "portool",
    w2_mode: W2Mode = "theorem",
    eps: float = 1e-6,
    tie_atol: float = 1e-6,
    outcome_shift: float = 0.0,
) -> dict[int, list[float]]:
    """PORTool advantages of every step of every trajectory of one query tree.

    Args:
        parents: ``parents[i]`` = parent of node i, -1 for the root (node 0, the query). Prune dead branches
            (nodes with no surviving trajectory) before calling: every leaf is one of the n trajectories.
        step_lengths: policy tokens |s_i| of step i (>= 1); the root's entry is ignored.
        leaf_outcomes: R_out of the trajectory ending at each leaf (+1 true, -1 false, 0 unable to answer).
        format_rewards: the rescaled formatting reward R_fm of step i (in [-0.25, 0.25]); root ignored.
        gamma: decay of Eq. 2 (paper value 0.95).
        w1: weight of the trajectory term (paper value 1.0, Theorem 3.1; 0 for the fork-only ablation).
        root_is_fork: count the root as a fork (default False: the paper's N_forks set starts at t = 1,
            portool.txt l. 536; True is the spec's [R] 8.6).
        aggregator, w2_mode, eps, tie_atol, outcome_shift: see :func:`portool_advantage_terms`.

    Returns:
        leaf -> advantages of the steps on its root-to-leaf path, depth 1 first; every token of a step takes
        that value inside that trajectory's sequence.
    """
    return portool_advantage_terms(
        parents,
        step_lengths,
        leaf_outcomes,
        format_rewards,
        gamma=gamma,
        w1=w1,
        root_is_fork=root_is_fork,
        aggregator=aggregator,
        w2_mode=w2_mode,
        eps=eps,
        tie_atol=tie_atol,
        outcome_shift=outcome_shift,
    ).advantages


def _step_lengths(step_lengths: Sequence[int] | Tensor, n_nodes: int) -> list[int]:
    if isinstance(step_lengths, Tensor):
        step_lengths = step_lengths.tolist()
    if isinstance(step_lengths, str | bytes) or not isinstance(step_lengths, Sequence):
        raise ValueError(f"step_lengths must be a sequence of ints, got {type(step_lengths).__name__}")
    if len(step_lengths) != n_nodes:
        raise ValueError(f"step_lengths has {len(step_lengths)} entries but the tree has {n_nodes} nodes")
    out = [as_int(x, f"step_lengths[{i}]") for i, x in enumerate(step_lengths)]
    for i, x in enumerate(out[1:], start=1):
        if x < 1:
            raise ValueError(f"step_lengths[{i}] = {x}: every step has at least one policy token")
    if out[0] < 0:
        raise ValueError(f"step_lengths[0] = {out[0]} must be >= 0 (the root's entry is not used)")
    return out
