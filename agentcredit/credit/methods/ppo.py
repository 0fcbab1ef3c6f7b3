"""PPO with masked GAE over the policy tokens (verl's multi-turn GAE): a token critic, the outcome on the last token
(preset ``ppo``; ``tips`` shapes the rewards this estimate reads).

Generalised advantage estimation (Schulman et al. 2016, Eqs. 11-16) run over the *policy* tokens of each row
only. In row b, the positions with ``mask == 1`` form, in order, the sequence i = 1..n; observation tokens
(tool output written by the environment) and padding are skipped, exactly like verl's multi-turn GAE
(tips.md Sec. 3.6)::

    delta_i = r_i + gamma * V_{i+1} - V_i          V_{n+1} = 0 (after the last policy token)
    A_i     = delta_i + gamma * lam * A_{i+1}      A_{n+1} = 0
    returns_i = A_i + V_i

so V_{i+1} is the value at the *next policy token*, however many observation tokens lie in between. Positions
with ``mask == 0`` get 0 in both outputs, and rewards placed on them are ignored (put turn rewards on the last
policy token of the turn). With ``gamma = lam = 1`` and ``V = 0``, ``A`` is the reward-to-go over the policy
tokens. The paper defaults (TIPS Table 10, Search-R1 PPO with its outcome reward) are ``gamma = lam = 1``;
Search-R1's and CARL's PPO baselines use ``lam = 0.95`` (carl-segment.md Table 5).

No advantage whitening here: that is a separate, optional step of the trainer.

The maths is :func:`gae_advantages`; the method is its settings, needs and the estimate on the neutral layout.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit._validate import (
    as_mask,
    finite_where,
    float_tensor,
    result_dtype,
    same_shape,
    unit_interval,
)
from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import Method, Needs, Settings

__all__ = ["METHOD", "GaeSettings", "gae_advantages"]


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Masked GAE advantages and returns.

    Args:
        token_rewards: ``[B, T]`` reward placed on each token (must be finite everywhere).
        values: ``[B, T]`` critic values V(s_t); only read where ``mask == 1`` (padding may hold anything).
        mask: ``[B, T]`` bool or 0/1; 1 on policy tokens.
        gamma: discount per policy token (paper value 1.0).
        lam: GAE lambda (paper value 1.0 for TIPS / outcome PPO).

    Returns:
        ``(advantages, returns)``, both ``[B, T]`` in the promoted float dtype of the inputs, 0 where
        ``mask == 0``.
    """
    float_tensor(token_rewards, "token_rewards")
    float_tensor(values, "values")
    shape = same_shape({"token_rewards": token_rewards, "values": values}, ndim=2)
    keep = as_mask(mask, "mask", shape)
    gamma = unit_interval(gamma, "gamma")
    lam = unit_interval(lam, "lam")
    finite_where(token_rewards, "token_rewards")
    finite_where(values, "values", keep)

    dtype = result_dtype(token_rewards, values)
    rewards = token_rewards.to(dtype)
    # Values off the mask are never used; zero them so a NaN in padding cannot leak through arithmetic.
    vals = torch.where(keep, values.to(dtype), torch.zeros((), dtype=dtype, device=values.device))
    batch, length = shape
    advantages = torch.zeros(shape, dtype=dtype, device=rewards.device)
    next_value = rewards.new_zeros(batch)
    next_adv = rewards.new_zeros(batch)
    # One reverse sweep over the columns, vectorised over the rows. A masked column leaves the carried
    # (next_value, next_adv) untouched, which is what skips observation tokens.
    for t in range(length - 1, -1, -1):
        on = keep[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv = delta + gamma * lam * next_adv
        next_value = torch.where(on, vals[:, t], next_value)
        next_adv = torch.where(on, adv, next_adv)
        advantages[:, t] = torch.where(on, adv, 0.0)
    returns = torch.where(keep, advantages + vals, 0.0)
    return advantages, returns


class GaeSettings(Settings):
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per policy token (TIPS Table 10: 1.0).")
    lam: float = Field(
        1.0, ge=0.0, le=1.0, description="GAE lambda (TIPS Table 10: 1.0; Search-R1's PPO baseline: 0.95)."
    )


def estimate(batch: EpisodeBatch, settings: GaeSettings) -> Estimate:
    values = batch.need("values", "gae")
    index = batch.token_index()
    rewards = batch.zeros()
    for j, (ep, step_rewards) in enumerate(zip(batch.episodes, batch.rewards_per_step(), strict=True)):
        batch.last_step(j, "gae")
        for s, r in zip(ep.steps, step_rewards, strict=True):
            rewards[s.row, s.end - 1] += r
    rew, mask = batch.gather(rewards, index)
    val, _ = batch.gather(values.to(batch.dtype), index)
    adv, ret = gae_advantages(rew, val, mask, gamma=settings.gamma, lam=settings.lam)
    trained = batch.trained_mask()
    return Estimate(batch.scatter(adv, index), trained, batch.scatter(ret, index), trained.clone())


class GaeVerlSettings(GaeSettings):
    """verl's ``agentcredit.ppo``: PPO's settings (the native ``algorithm.ppo``) plus verl's whitening."""

    whiten: bool = Field(
        True, description="masked whitening of the advantages over the batch (verl's GAE does it)."
    )


METHOD = Method(
    name="ppo",
    settings=GaeSettings,
    trainer_settings=(("verl", GaeVerlSettings),),
    needs=Needs(critic="token", rollout="independent", signals=frozenset({"values"})),
    source="PPO + GAE, verl multi-turn GAE",
    estimate=estimate,
    former_keys=(
        ("algorithm.gae", "algorithm.ppo"),
        ("algorithm.gamma", "algorithm.ppo.gamma"),
        ("algorithm.lam", "algorithm.ppo.lam"),
    ),
    former_names=("gae",),
)
