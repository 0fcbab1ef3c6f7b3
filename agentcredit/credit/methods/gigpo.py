"""GiGPO: group-in-group advantages, an episode-level group and step-level groups by anchor state.

The whole method in one file: the maths (:func:`gigpo_advantages`, pure), its settings, its needs
and its estimate on the layout.

Feng et al., *Group-in-Group Policy Optimization for LLM Agent Training* (NeurIPS 2025; verl-agent's
``algorithm.adv_estimator=gigpo``). For episode i of group g (the episodes of one prompt) with T_i steps and
outcome reward R_i at its last step::

    A^E_i      = (R_i - mean_g R) / (std_g R + eps)                         episode level (GRPO)
    G_{i,t}    = gamma^(T_i - 1 - t) R_i                                     discounted return of step t
    A^S_{i,t}  = (G_{i,t} - mean_S G) / (std_S G + eps),  S = {(j, u): g_j = g_i, s_{j,u} = s_{i,t}}
    A_{i,t}    = A^E_i + w A^S_{i,t}                                         (w = step_advantage_w)

One difference from verl-agent's code, on purpose: its episode level (``episode_norm_reward`` with
``compute_mean_std_cross_steps=True``) takes the mean and std over step rows, so a longer episode weighs more,
and keeps the raw score of an episode group of one. Here the episode level is GRPO per episode, as written in the
paper, and a group of one gets 0 (as every group estimator here, see :mod:`agentcredit.credit.methods.grpo`).

where s_{i,t} is the *anchor state* before step t: steps taken from the same state by episodes of one group form
a step group. The caller chooses what a state is; the trainer uses the whole context before the step (see
``agentcredit.train.advantages``: the ``anchors`` step input), which one episode never visits twice.
``scale=False`` is verl-agent's ``mode=mean_norm`` (the mean is subtracted, nothing is divided), on both levels.

Both levels are GRPO's group z-scores (:func:`agentcredit.credit._stats.group_zscores`), so a group of one, or a group whose returns are
all equal, contributes 0, as in verl-agent (a singleton step group there has mean = its own return).
The per-step returns only need R_i and T_i because every task here pays its reward at the end of an episode.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit._stats import group_zscores
from agentcredit.credit._validate import finite_float, float_list
from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import Method, Needs, Settings

__all__ = ["METHOD", "GigpoSettings", "gigpo_advantages"]


def gigpo_advantages(
    rewards: Sequence[float] | Tensor,
    group_ids: Sequence[Hashable],
    anchors: Sequence[Sequence[Hashable]],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    eps: float = 1e-6,
    scale: bool = True,
) -> list[Tensor]:
    """Per episode, the GiGPO advantage of each of its steps.

    Args:
        rewards: ``B`` outcome rewards, one per episode.
        group_ids: ``B`` hashable labels; equal labels form an episode group (one prompt).
        anchors: per episode, one hashable anchor state per step (``T_i >= 1``): the state the step was taken
            from. Equal anchors within an episode group form a step group.
        gamma: discount of the step returns (verl-agent: ``algorithm.gamma`` 0.95).
        step_weight: w, the weight of the step-level advantage (verl-agent: ``step_advantage_w`` 1.0).
        eps: added to each std (verl: 1e-6).
        scale: divide by the group std on both levels (``mean_std_norm``) or not (``mean_norm``).

    Returns:
        ``B`` float64 tensors, tensor i of shape ``[T_i]``.
    """
    rewards = torch.as_tensor(float_list(rewards, "rewards"), dtype=torch.float64)
    gamma, step_weight = finite_float(gamma, "gamma"), finite_float(step_weight, "step_weight")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if isinstance(group_ids, str | bytes) or len(group_ids) != len(rewards):
        raise ValueError(f"group_ids must hold one label per episode ({len(rewards)}), got {group_ids!r}")
    if len(anchors) != len(rewards):
        raise ValueError(f"anchors has {len(anchors)} episodes but rewards has {len(rewards)}")
    for i, steps in enumerate(anchors):
        if isinstance(steps, str | bytes) or len(steps) == 0:
            raise ValueError(f"anchors[{i}] must list one anchor state per step (at least one step)")
    episode = group_zscores(rewards, group_ids, eps=eps, scale=scale)
    returns, step_groups = [], []
    for i, steps in enumerate(anchors):
        last = len(steps) - 1
        for t, anchor in enumerate(steps):
            returns.append(float(rewards[i]) * gamma ** (last - t))
            step_groups.append((group_ids[i], anchor))
    step = group_zscores(torch.tensor(returns, dtype=torch.float64), step_groups, eps=eps, scale=scale)
    out, k = [], 0
    for i, steps in enumerate(anchors):
        out.append(episode[i] + step_weight * step[k : k + len(steps)])
        k += len(steps)
    return out


class GigpoSettings(Settings):
    gamma: float = Field(
        0.95, ge=0.0, le=1.0, description="Discount of the step returns (verl-agent algorithm.gamma: 0.95)."
    )
    step_weight: float = Field(
        1.0, description="w: weight of the step-level advantage (step_advantage_w: 1.0)."
    )
    mode: Literal["mean_std_norm", "mean_norm"] = Field(
        "mean_std_norm", description="Both levels divide by the group std (mean_std_norm) or only centre."
    )
    eps: float = Field(1e-6, gt=0.0, description="Added to the group std (verl-agent's epsilon: 1e-6).")


def estimate(batch: EpisodeBatch, settings: GigpoSettings) -> Estimate:
    anchors = [[s.anchor for s in ep.steps] for ep in batch.episodes]
    steps = gigpo_advantages(
        [ep.reward for ep in batch.episodes],
        [ep.group for ep in batch.episodes],
        anchors,
        gamma=settings.gamma,
        step_weight=settings.step_weight,
        eps=settings.eps,
        scale=settings.mode == "mean_std_norm",
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


METHOD = Method(
    name="gigpo",
    settings=GigpoSettings,
    # loss: token-mean, verl's default, which verl-agent's GiGPO runs use
    needs=Needs(step_inputs=frozenset({"anchors"})),
    source="GiGPO, Feng et al. 2025 (verl-agent gigpo)",
    estimate=estimate,
)
