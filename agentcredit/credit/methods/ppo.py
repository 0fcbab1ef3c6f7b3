"""PPO with GAE over the policy tokens (verl's multi-turn GAE): a token critic, the outcome on the last token.

The maths is :func:`agentcredit.credit.gae.gae_advantages`.
"""

from __future__ import annotations

from pydantic import Field

from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.gae import gae_advantages
from agentcredit.credit.methods.base import Method, Needs, Settings


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


METHOD = Method(
    name="ppo",
    settings=GaeSettings,
    needs=Needs(critic="token", rollout="independent", signals=frozenset({"values"})),
    source="PPO + GAE, verl multi-turn GAE",
    estimate=estimate,
)
