"""GRPO: the group-normalised outcome advantage on every step (Shao et al. 2024, Eq. 3).

The maths is :func:`agentcredit.credit.grpo.grpo_advantages`; this file is the method: settings, needs and the
estimate on the neutral layout.
"""

from __future__ import annotations

import torch
from pydantic import Field

from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.grpo import grpo_advantages
from agentcredit.credit.methods.base import Method, Needs, Settings


class GrpoSettings(Settings):
    eps: float = Field(1e-6, gt=0.0, description="added to the group std (verl's epsilon: 1e-6).")
    scale: bool = Field(
        True,
        description="divide by the group std (GRPO, Shao et al. 2024 Eq. 3); False = Dr.GRPO (Liu et al. 2025).",
    )


def estimate(batch: EpisodeBatch, settings: GrpoSettings) -> Estimate:
    rewards = torch.tensor([ep.reward for ep in batch.episodes], dtype=torch.float64)
    per_episode = grpo_advantages(
        rewards, [ep.group for ep in batch.episodes], eps=settings.eps, scale=settings.scale
    )
    per_step = [
        [float(a)] * len(ep.steps) for ep, a in zip(batch.episodes, per_episode.tolist(), strict=True)
    ]
    return Estimate(batch.paint_steps(per_step, batch.zeros()), batch.trained_mask())


# token-mean, verl's default, is what agentcredit's grpo trains with (its Needs); the paper's Eq. 3 is
# seq-mean-token-mean, available as algorithm.loss_agg=seq-mean-token-mean.
METHOD = Method(
    name="grpo",
    settings=GrpoSettings,
    needs=Needs(loss_agg="token-mean"),
    source="GRPO, Shao et al. 2024 Eq. 3",
    estimate=estimate,
)
