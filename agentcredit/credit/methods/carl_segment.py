"""carl-segment: segment-level TD advantages from a boundary critic V = sigmoid(head) (Eqs. 1, 3, 6).

The advantage maths is :func:`segment_advantages`; this file also holds the method's critic: its values
(:func:`critic_values`), Monte-Carlo targets (:func:`monte_carlo_targets`, §3.5) and the per-token weights of a
trainer whose losses sum tokens (:func:`critic_weights`), which the verl adapter calls.

One advantage per tool-use segment from a critic read at segment boundaries. Paper: "CARL: segment-level credit assignment for LLM tool use" (spec ``carl-segment.md`` Sec. 3). An episode
with K tool calls has N + 1 = 2K + 1 segments (invoke, assimilate) x K then commit; segment k is generated from
boundary state b_k (transient states after a raw tool output and persistent ones alike), and the critic gives
V(b_0), ..., V(b_N). With a terminal-only reward R (Eq. 4 with r_k = 0 for k < N, r_N = R)::

    delta_k = gamma * V(b_{k+1}) - V(b_k)        k < N
    delta_N = R - V(b_N)                          (V(b_{N+1}) = 0: the episode has ended)
    A_k     = sum_{l >= 0} (gamma * lam)^l * delta_{k+l}          segment-level GAE, Eq. 6

``lam = 0`` (the paper's choice, Table 5) gives Eq. 1: A_k = V(b_{k+1}) - V(b_k) and A_N = R - V(b_N), which
telescope to R - V(b_0) (Eq. 5). ``lam = 1`` with ``gamma = 1`` gives A_k = R - V(b_k) (Eq. 7), the
trajectory-level limit of the lambda ablation (App. H.1). Every policy token of segment k shares A_k, and the
loss is Eq. 3: ``policy_loss(..., agg="segment-mean")``.

``gamma`` is a discount per *segment* (the issue's contract). The paper's SMDP TD error (App. A, Eq. 4) discounts
by gamma^{tau_k}, tau_k = the segment's length in tokens; where the two differ the paper wins, so passing
``segment_lengths`` switches to Eq. 4: delta_k = gamma^{tau_k} V(b_{k+1}) - V(b_k) and
A_k = delta_k + gamma^{tau_k} * lam * A_{k+1}. At the paper's gamma = 1 (the only value it uses) both agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit._validate import as_int, finite_float, float_list, unit_interval
from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import Method, Needs, Settings, TokenWeights
from agentcredit.credit.metrics import explained_variance

__all__ = ["METHOD", "CarlSegmentSettings", "segment_advantages"]


def segment_advantages(
    boundary_values: Sequence[float] | Tensor,
    reward: float,
    *,
    lam: float = 0.0,
    gamma: float = 1.0,
    segment_lengths: Sequence[int] | None = None,
    segment_rewards: Sequence[float] | None = None,
) -> list[float]:
    """Advantages of the N + 1 segments of one episode.

    Args:
        boundary_values: ``[V(b_0), ..., V(b_N)]``, the critic at the start of each segment (at least one).
        reward: the outcome reward R of the episode (EM in {0, 1} in the paper).
        lam: segment-level GAE lambda (paper value 0.0, one-step TD).
        gamma: discount (paper value 1.0), per segment, or per token with ``segment_lengths``.
        segment_lengths: tau_k, the token count of each segment; when given, segment k is discounted by
            gamma^{tau_k} as in the paper's SMDP Eq. 4 (default None: one discount step per segment).
        segment_rewards: r_0, ..., r_{N-1}, rewards earned during the intermediate segments (Eq. 4's r_k; the
            paper's reward is terminal-only, so the default None means all zero). Used to compose carl-segment's
            boundary critic with TIPS turn rewards: delta_k = r_k + gamma V(b_{k+1}) - V(b_k).

    Returns:
        ``[A_0, ..., A_N]`` as Python floats.
    """
    values = float_list(boundary_values, "boundary_values", min_len=1)
    reward = finite_float(reward, "reward")
    lam = unit_interval(lam, "lam")
    gamma = unit_interval(gamma, "gamma")
    n = len(values)
    if segment_lengths is None:
        discounts = [gamma] * n
    else:
        if isinstance(segment_lengths, str | bytes) or not isinstance(segment_lengths, Sequence):
            raise ValueError(
                f"segment_lengths must be a sequence of ints, got {type(segment_lengths).__name__}"
            )
        if len(segment_lengths) != n:
            raise ValueError(
                f"segment_lengths has {len(segment_lengths)} entries but boundary_values has {n}; give one per segment"
            )
        taus = [as_int(tau, f"segment_lengths[{k}]") for k, tau in enumerate(segment_lengths)]
        for k, tau in enumerate(taus):
            if tau < 1:
                raise ValueError(f"segment_lengths[{k}] = {tau}: a segment has at least one token")
        discounts = [gamma**tau for tau in taus]
    next_values = values[1:] + [0.0]
    if segment_rewards is None:
        step_rewards = [0.0] * (n - 1) + [reward]
    else:
        intermediate = float_list(segment_rewards, "segment_rewards")
        if len(intermediate) != n - 1:
            raise ValueError(
                f"segment_rewards has {len(intermediate)} entries; give one per intermediate segment ({n - 1})"
            )
        step_rewards = intermediate + [reward]
    out = [0.0] * n
    running = 0.0
    for k in range(n - 1, -1, -1):
        delta = step_rewards[k] + discounts[k] * next_values[k] - values[k]
        running = delta + discounts[k] * lam * running
        out[k] = running
    return out


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


def critic_weights(batch: EpisodeBatch, rows_per_episode: float) -> TokenWeights:
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
    return TokenWeights(returns, value_weights, loss_weights, stats)


class CarlSegmentVerlSettings(CarlSegmentSettings):
    """verl's ``agentcredit.carl_segment``: carl-segment's settings (the native ``algorithm.carl_segment``) plus
    how verl expresses Eq. 3."""

    segment_mean_loss: bool = Field(
        False,
        description=(
            "divide each segment's advantage by its token count (times rows/episodes) so that verl's "
            "loss_agg_mode=seq-mean-token-sum equals the paper's segment-mean (Eq. 3), and weigh the actor's entropy "
            "and KL terms the same way (agentcredit's actor loss); off = plain token advantages."
        ),
    )


def verl_config_errors(config: Any, settings: CarlSegmentVerlSettings, method: str) -> list[str]:
    """verl's config (its Hydra tree: nodes with ``.get``) for the losses of carl-segment's verl recipe.

    Replacement views make several rows per episode. Per-row modes would weigh an episode by its row count, so only
    token-mean (a per-token weight, rows do not matter) or ``segment_mean_loss``'s folded weights under
    seq-mean-token-sum weigh trajectories as agentcredit's trainer does. verl's shuffled iterator would split the
    mini-batches of whole episodes the verl trainer lays out (docs/scaling-out-with-verl.md)."""
    errors = []
    actor = config.get("actor_rollout_ref").get("actor")
    mode = actor.get("loss_agg_mode", "token-mean")
    wanted = "seq-mean-token-sum" if settings.segment_mean_loss else "token-mean"
    if mode != wanted:
        errors.append(
            f"agentcredit.method={method} with segment_mean_loss={settings.segment_mean_loss} "
            f"needs actor_rollout_ref.actor.loss_agg_mode={wanted} (got {mode}): other modes weigh an episode "
            "by the number of rows (views) it was rendered as"
        )
    for key, section in (("actor_rollout_ref.actor", actor), ("critic", config.get("critic"))):
        if section.get("shuffle", False):
            errors.append(
                f"agentcredit.method={METHOD.name} needs {key}.shuffle=False: verl shuffles rows, which would "
                "split the mini-batches of whole episodes the trainer lays out"
            )
    distillation = config.get("distillation")
    if settings.segment_mean_loss and distillation is not None and distillation.get("enabled", False):
        errors.append(
            f"agentcredit.method={METHOD.name} with segment_mean_loss replaces the actor's loss with agentcredit's "
            "(segment-mean KL and entropy), which would drop verl's distillation loss: turn distillation off"
        )
    return errors


METHOD = Method(
    name="carl-segment",
    settings=CarlSegmentSettings,
    trainer_settings=(("verl", CarlSegmentVerlSettings),),
    # the boundary critic: Linear(d,d) -> GELU -> Linear(d,1) -> sigmoid, last layer zero-init (§3.4); the loss is
    # Eq. 3's segment-mean (token-mean per segment, sum over segments, mean over trajectories)
    needs=Needs(
        critic="boundary", rollout="independent", signals=frozenset({"values"}), loss_agg="segment-mean"
    ),
    source="carl-segment Eqs. 1, 3, 6",
    estimate=estimate,
    critic_values=critic_values,
    token_weights=critic_weights,
    trainer_checks=(("verl", verl_config_errors),),
    former_keys=(
        ("algorithm.gamma", "algorithm.carl_segment.gamma"),
        ("algorithm.lam", "algorithm.carl_segment.lam"),
    ),
    former_names=("segment",),
)
