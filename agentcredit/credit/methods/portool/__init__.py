"""PORTool: step rewards on a tree of tool-call steps, trajectory plus fork advantages (Eqs. 1-3, Thm 3.1).

The maths is :func:`~agentcredit.credit.methods.portool.maths.portool_advantage_terms` (``maths.py``). PORTool scores outcomes with its own
judge (``needs.reward = "judge"``) and reads the protocol's formatting reward of every step.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Literal

from pydantic import Field

from agentcredit.credit.estimators import (
    DecisionTree,
    EpisodeBatch,
    Estimate,
    episode_groups,
    leaf_rewards,
    outcome_part,
)
from agentcredit.credit.methods.base import Method, Needs, Settings
from agentcredit.credit.methods.portool.maths import (
    AGGREGATORS,
    W2_MODES,
    PortoolTerms,
    portool_advantage_terms,
    portool_advantages,
)

__all__ = [
    "METHOD",
    "PortoolSettings",
    "AGGREGATORS",
    "W2_MODES",
    "PortoolTerms",
    "portool_advantage_terms",
    "portool_advantages",
]


class PortoolSettings(Settings):
    gamma: float = Field(0.95, ge=0.0, le=1.0, description="Step-reward decay gamma (paper: 0.95).")
    w1: float = Field(1.0, description="Weight of the trajectory-relative advantage (paper: 1).")
    # paper: F(q) = {s_kt : |C(s_kt)| > 1, t in [T_k]} (portool.txt l. 536) starts at the first step, so the query
    # is no fork; the spec's [R] 8.6 counts it (True). The paper wins over the spec.
    root_is_fork: bool = Field(
        False,
        description="Count the root (the query) as a fork in N_forks and give first steps a fork term (paper: "
        "False, its fork set starts at t = 1; True = portool.md 8.6's recommendation).",
    )
    # the paper's judge maps true / false / unable_to_answer to +1 / -1 / 0 (portool.txt l. 452-453) and is silent on
    # an episode cut at the step cap without response_gen; portool.md 3.1 / 8.13 resolve it to -1
    unfinished_reward: float = Field(
        -1.0,
        ge=-1.0,
        le=1.0,
        description="R_out of an episode cut at the step cap without an answer (paper: unstated; portool.md 8.13: "
        "-1, configurable to 0).",
    )
    outcome_shift: float = Field(
        0.0,
        description="VARIANT, not PORTool (paper: 0): add this to R_out inside Eq. 2's decay; 1 maps {-1, 0, +1} to "
        "{0, 1, 2}, so all-failing trees push nothing (preset portool-shifted-outcome).",
    )
    # App. B (portool.txt l. 1034-1044, remark l. 1142-1143): the token objective is the sum of a trajectory term
    # and a fork term, each in its own clipped min, "not a single sum inside one min"; Theorem 3.1's
    # J = J_GRPO_trj + J_GRPO_fork (l. 537) holds for that sum. portool.md 8.9 chose single_min; the paper wins.
    combine: Literal["split_min", "single_min"] = Field(
        "split_min",
        description="split_min (paper, App. B): trajectory and fork terms each get their own clipped min; "
        "single_min: one min on their sum (Eq. 1 with Eq. 3, portool.md 8.9).",
    )


class PortoolNativeSettings(PortoolSettings):
    """The native trainer's ``algorithm.portool``: PORTool's settings plus its outcome judge."""

    judge: Literal["rule", "llm"] = Field(
        "rule", description="Outcome judge: rule-based EM/F1 (default) or a local LLM."
    )
    judge_model: str | None = Field(None, description="Local model path for the LLM judge.")


class PortoolVerlSettings(PortoolSettings):
    """verl's ``agentcredit.portool``: PORTool's settings plus where the agent loop finds the formatting reward."""

    # verl's actor loss takes one advantage per token, so verl runs the single min on Eq. 3 (portool.md 8.9); the
    # paper's split min (App. B) is the native trainer's algorithm.portool.combine
    combine: Literal["single_min"] = Field(
        "single_min", description="single_min only: verl's actor loss takes one advantage per token."
    )

    format_reward_key: str = Field(
        "format_reward",
        description="turn.info key holding the rescaled formatting reward R_fm in [-0.25, 0.25].",
    )


def group_terms(
    batch: EpisodeBatch, group: Hashable, members: list[int], settings: PortoolSettings
) -> tuple[PortoolTerms, dict[int, float]]:
    """One query tree's Eq. 2 step rewards and Eq. 3 terms (and its leaves' outcomes), as the estimate computes
    them: R_fm(v) is the protocol's formatting reward of step v plus any environment step reward, R_out the
    outcome alone (so none counts twice). The mechanism probe reads the step rewards here."""
    tree = batch.tree(group, "portool")
    lengths = [0] * len(tree.parents)
    fmt = [0.0] * len(tree.parents)
    for j in members:
        for s in batch.episodes[j].steps:
            lengths[s.node] = s.length
            fmt[s.node] = s.format_reward + s.env_reward  # an environment's step reward is R_fm's peer
    outcomes = leaf_rewards(batch, members, "portool", outcome_part)
    terms = portool_advantage_terms(
        list(tree.parents),
        lengths,
        outcomes,
        fmt,
        gamma=settings.gamma,
        w1=settings.w1,
        root_is_fork=settings.root_is_fork,
        outcome_shift=settings.outcome_shift,
    )
    return terms, outcomes


def estimate(batch: EpisodeBatch, settings: PortoolSettings) -> Estimate:
    """PORTool Eqs. 1-3 per query tree; with ``combine="split_min"`` (App. B, the default) the Estimate also
    carries the trajectory and fork terms as two advantages, each clipped in its own min by the loss.

    Statistics (per step, ``portool/*``): the share of trees with no correct trajectory (no R_out >= 1, the
    judge's "true") and the share of the batch's |advantage| (summed over trained tokens, as the loss sees them)
    that lies in those trees. In the PORTool study 13 of 16 step-1 trajectories were wrong, and in such trees
    Eq. 2's decay on the -1 outcome plus the sibling z-score credited searching again: these show that regime.
    """
    per_step: list[list[float]] = [[] for _ in batch.episodes]
    trj_step: list[list[float]] = [[] for _ in batch.episodes]
    fork_step: list[list[float]] = [[] for _ in batch.episodes]
    groups = episode_groups(batch)
    failing_trees = 0
    abs_all = abs_failing = 0.0
    for group, members in groups.items():
        terms, outcomes = group_terms(batch, group, members, settings)
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
    if settings.combine == "split_min":
        parts = (batch.paint_steps(trj_step, batch.zeros()), batch.paint_steps(fork_step, batch.zeros()))
    adv = batch.paint_steps(per_step, batch.zeros())
    return Estimate(adv, batch.trained_mask(), stats=stats, parts=parts)


def merged_steps(trees: Iterable[DecisionTree]) -> float:
    """Policy steps per tree that the identical-sibling merge folded into a sibling (portool.md 2.8 step 3): a
    merged node stands for ``tree.merged[node]`` sampled steps. Many merges at the root mean the n first steps
    were mostly the same text, so the root's siblings give the fork term little to compare."""
    trees = list(trees)
    merged = sum(n - 1 for tree in trees for n in (tree.merged or {}).values() if n > 1)
    return merged / max(len(trees), 1)


def stats(batch: EpisodeBatch) -> dict[str, float]:
    return {"portool/merged_steps": merged_steps(batch.trees.values())}


METHOD = Method(
    name="portool",
    settings=PortoolSettings,
    trainer_settings=(("native", PortoolNativeSettings), ("verl", PortoolVerlSettings)),
    needs=Needs(
        rollout="step_forks",
        step_inputs=frozenset({"tree", "format_reward"}),
        reward="judge",
        loss_agg="seq-mean-token-mean",  # Eq. 1, required by Theorem 3.1
    ),
    source="PORTool Eqs. 1-3, Thm 3.1",
    estimate=estimate,
    stats=stats,
    report_settings=(
        "algorithm.portool.combine",
        "algorithm.portool.root_is_fork",
        "algorithm.portool.unfinished_reward",
        "algorithm.portool.outcome_shift",
    ),
    # Eq. 2 decays the outcome as written; shifting it first is agentcredit's variant (portool-shifted-outcome)
    variant=lambda saved: "VARIANT (not PORTool)" if saved.get("outcome_shift") else None,
    # trees with no correct trajectory and their share of |A| (the regime where Eq. 2's decay on -1 credits
    # searching), merged sibling steps
    diagnostics=(
        ("portool/failing_tree_frac", "trees w/o success"),
        ("portool/failing_abs_adv_share", "|A| share of failing trees"),
        ("portool/merged_steps", "merged steps/tree"),
    ),
)
