"""Method name -> the parts of :mod:`agentcredit.credit.estimators` it is made of, and how its loss aggregates.

Like verl's advantage-estimator registry, but a method may compose parts: ``gear`` reweights GRPO's advantage,
``tips`` shapes rewards that GAE then turns into advantages. Every list of methods (the verl adapter's, the
benchmarks', the tests') is derived from :data:`PRESETS`, and ``tests/credit/test_credit_registry.py`` ties
every method preset of ``configs/methods/`` to its entry. ``loss_agg`` is the ``policy_loss`` aggregation the
method trains with (the paper's, except where a comment says otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from agentcredit.credit.estimators import ESTIMATORS

__all__ = ["CreditPreset", "PRESETS", "get_preset"]


@dataclass(frozen=True)
class CreditPreset:
    """How one method turns a rollout into advantages."""

    name: str
    estimator: str  # a key of ESTIMATORS
    loss_agg: str  # a policy_loss aggregation
    source: str  # where the formulas come from
    shaping: Literal["none", "tips"] = "none"  # estimators.tips_step_rewards before the estimator
    reweight: Literal["none", "gear"] = "none"  # estimators.gear_reweight after it

    @property
    def needs_critic(self) -> bool:
        return ESTIMATORS[self.estimator].needs_critic


PRESETS: Mapping[str, CreditPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            # token-mean, verl's default, is what agentcredit's grpo trains with (configs/methods/grpo.yaml); the
            # paper's Eq. 3 is seq-mean-token-mean, available as algorithm.loss_agg=seq-mean-token-mean.
            CreditPreset("grpo", "grpo", "token-mean", "GRPO, Shao et al. 2024 Eq. 3"),
            CreditPreset("ppo", "gae", "token-mean", "PPO + GAE, verl multi-turn GAE"),
            CreditPreset("carl-segment", "segment", "segment-mean", "carl-segment Eqs. 1, 3, 6"),
            CreditPreset("carl-critical", "critical", "token-mean", "carl-critical Eqs. 9-13, 2"),
            CreditPreset("portool", "portool", "seq-mean-token-mean", "PORTool Eqs. 1-3, Thm 3.1"),
            CreditPreset("tips", "gae", "token-mean", "TIPS Eqs. 17-20, Table 10", shaping="tips"),
            CreditPreset("gear", "grpo", "seq-mean-token-mean", "GEAR Eqs. 2-6", reweight="gear"),
            CreditPreset("gigpo", "gigpo", "token-mean", "GiGPO, Feng et al. 2025 (verl-agent gigpo)"),
        )
    }
)


def get_preset(name: str) -> CreditPreset:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown credit preset {name!r}; known presets: {', '.join(PRESETS)}") from None
