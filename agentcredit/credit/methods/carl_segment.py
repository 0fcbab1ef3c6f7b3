"""carl-segment: segment-level TD advantages from a boundary critic V = sigmoid(head) (Eqs. 1, 3, 6).

The advantage maths is :func:`agentcredit.credit.carl_segment.segment_advantages`; this file also holds the
method's critic: its values (:func:`critic_values`), Monte-Carlo targets (:func:`monte_carlo_targets`, §3.5) and
the per-token weights of a trainer whose losses sum tokens (:func:`critic_weights`), which the verl adapter calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit.carl_segment import segment_advantages
from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import Method, Needs, Settings
from agentcredit.credit.metrics import explained_variance


class CarlSegmentSettings(Settings):
    lam: float = Field(
        0.0, ge=0.0, le=1.0, description="segment-level GAE lambda (paper: 0, one-step TD; Tab. 10 ablation)."
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="per-segment discount (paper: 1.0).")


def critic_values(head: Tensor) -> Tensor:
    """V = sigmoid(head) in [0, 1] (§3.4): the critic's value where the method reads it, from the head's output."""
    return torch.sigmoid(head.float())


def monte_carlo_targets(batch: EpisodeBatch) -> list[list[float]]:
    """Per episode, per step: the Monte-Carlo target of V(b_k) (carl-segment.md §3.5), the reward still to come:
    the episode's reward, unless an environment paid part of it at earlier steps (never TIPS's shaped rewards)."""
    return [[float(sum(rewards[k:])) for k in range(len(rewards))] for rewards in batch.environment_rewards()]


def estimate(batch: EpisodeBatch, settings: CarlSegmentSettings) -> Estimate:
    values = batch.need("values", "segment")
    per_step = []
    returns = batch.zeros()
    value_mask = torch.zeros(batch.shape, dtype=torch.bool)
    targets = monte_carlo_targets(batch)
    for j, (ep, rewards) in enumerate(zip(batch.episodes, batch.rewards_per_step(), strict=True)):
        batch.last_step(j, "segment")
        boundary = [float(values[s.row, s.start]) for s in ep.steps]
        # rewards[-1] is the outcome (minus alpha Phi(S_M) under TIPS shaping); the others are turn rewards
        per_step.append(
            segment_advantages(
                boundary, rewards[-1], lam=settings.lam, gamma=settings.gamma, segment_rewards=rewards[:-1]
            )
        )
        for k, s in enumerate(ep.steps):
            value_mask[s.row, s.start] = True
            returns[s.row, s.start] = targets[j][k]  # the Monte-Carlo target at every boundary (§3.5)
    adv = batch.paint_steps(per_step, batch.zeros())
    return Estimate(adv, batch.trained_mask(), returns=returns, value_mask=value_mask)


@dataclass
class CriticWeights:
    """carl-segment's critic and segment-mean loss as per-token tensors, for a trainer whose losses sum tokens."""

    returns: (
        Tensor  # the Monte-Carlo target on every token of its segment (where verl's metrics read returns)
    )
    value_weights: (
        Tensor  # the critic's loss weight: at the boundaries only, mean over them, then over episodes
    )
    loss_weights: Tensor  # Eq. 3's segment-mean as a per-token weight 1/|g_k| (times rows per episode)
    stats: dict[str, float]


def critic_weights(batch: EpisodeBatch, rows_per_episode: float) -> CriticWeights:
    """The per-token targets and weights of carl-segment's losses under a token-summing loss whose mini-batch sum
    is divided by its rows (verl's seq-mean-token-sum): ``rows_per_episode`` (rows / episodes of the mini-batch)
    turns that into a mean over the mini-batch's episodes.

    The critic regresses V(b_k) on the Monte-Carlo target at the boundaries only, mean over a trajectory's
    boundaries then over trajectories (A12). Eq. 3 averages tokens within a segment and sums segments; PPO's
    clipped surrogate is positively homogeneous in A, so that is a per-token weight 1/|g_k| on the advantage
    (and on the entropy and KL terms, A12). The batch's ``values`` signal must hold V (:func:`critic_values`).
    """
    returns = batch.zeros()
    value_weights = batch.zeros()
    loss_weights = batch.zeros()
    targets = monte_carlo_targets(batch)
    values = batch.signal("values", "carl-segment")
    boundary_values, boundary_targets = [], []
    for j, ep in enumerate(batch.episodes):
        for k, s in enumerate(ep.steps):
            returns[s.row, s.start : s.end] = targets[j][k]
            value_weights[s.row, s.start] = rows_per_episode / len(ep.steps)
            loss_weights[s.row, s.start : s.end] = rows_per_episode / s.length
            boundary_values.append(float(values[s.row, s.start]))
            boundary_targets.append(targets[j][k])
    n = max(len(batch.episodes), 1)
    stats = {
        "boundary_value_mean": sum(boundary_values) / max(len(boundary_values), 1),
        "boundary_explained_variance": explained_variance(boundary_values, boundary_targets),
        "segments_per_episode": sum(len(e.steps) for e in batch.episodes) / n,
    }
    return CriticWeights(returns, value_weights, loss_weights, stats)


METHOD = Method(
    name="carl-segment",
    settings=CarlSegmentSettings,
    # the boundary critic: Linear(d,d) -> GELU -> Linear(d,1) -> sigmoid, last layer zero-init (§3.4); the loss is
    # Eq. 3's segment-mean (token-mean per segment, sum over segments, mean over trajectories)
    needs=Needs(
        critic="boundary", rollout="independent", signals=frozenset({"values"}), loss_agg="segment-mean"
    ),
    source="carl-segment Eqs. 1, 3, 6",
    estimate=estimate,
)
