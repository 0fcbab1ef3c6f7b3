"""GRPO and Dr.GRPO: group-normalised outcome advantages on every step (preset ``grpo``; the base of ``gear``).

For each episode i of group g (the episodes sampled for one prompt)::

    A_i = (R_i - mean_g R) / (std_g R + eps)        GRPO (Shao et al. 2024, Eq. 3; carl-critical Eq. 4;
                                                    GEAR Sec. 3.2; PORTool's A_trj, spec Sec. 3.4)
    A_i =  R_i - mean_g R                            Dr.GRPO (Liu et al. 2025): ``scale=False``

``std_g`` is the unbiased sample standard deviation (``torch.std``, n - 1 in the denominator), as in verl's
``compute_grpo_outcome_advantage``. A group of one episode, or a group whose rewards are all equal, gets 0:
there is nothing to compare with (verl's singleton rule of mean 0 / std 1 would instead return the raw reward,
which the specs reject, portool.md Sec. 3.5). The method broadcasts the advantage to every step of the episode.

The maths is :func:`grpo_advantages`; the method is its settings, needs and the estimate on the neutral layout.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit._stats import group_zscores
from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import Method, Needs, Settings

__all__ = ["METHOD", "GrpoSettings", "grpo_advantages"]


def grpo_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable] | Tensor,
    *,
    eps: float = 1e-6,
    scale: bool = True,
) -> Tensor:
    """Group-normalised advantages, one per episode.

    Args:
        rewards: ``[B]`` outcome reward per episode (float32 or float64; a list becomes the default dtype).
        group_ids: ``B`` hashable labels; episodes with equal labels form one group (one prompt). Any order.
        eps: added to the std (verl's ``epsilon = 1e-6``).
        scale: divide by the group std (GRPO, True) or only subtract the group mean (Dr.GRPO, False).

    Returns:
        ``[B]`` advantages in the dtype of ``rewards``.
    """
    return group_zscores(rewards, group_ids, eps=eps, scale=scale)


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
    former_keys=(
        ("algorithm.grpo_eps", "algorithm.grpo.eps"),
        ("algorithm.grpo_scale", "algorithm.grpo.scale"),
    ),
    # GRPO and Dr.GRPO need only the outcomes and the groups (verl's own trainers call them)
    outcome_estimators=(
        ("grpo", lambda rewards, group_ids, *, eps: grpo_advantages(rewards, group_ids, eps=eps, scale=True)),
        (
            "drgrpo",
            lambda rewards, group_ids, *, eps: grpo_advantages(rewards, group_ids, eps=eps, scale=False),
        ),
    ),
)
