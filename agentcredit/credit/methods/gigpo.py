"""GiGPO: episode- plus step-level group advantages, steps grouped by anchor state (Feng et al. 2025).

The maths is :func:`agentcredit.credit.gigpo.gigpo_advantages`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal

from pydantic import Field

from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.gigpo import gigpo_advantages
from agentcredit.credit.methods.base import Method, Needs, Settings


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
    section="gigpo",
    settings=GigpoSettings,
    needs=Needs(step_inputs=frozenset({"anchors"})),
    source="GiGPO, Feng et al. 2025 (verl-agent gigpo)",
    estimate=estimate,
    estimator="gigpo",
)
