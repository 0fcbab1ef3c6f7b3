"""Preset name -> the credit estimator(s) a method uses, and how its loss aggregates.

Like verl's advantage-estimator registry, but a preset may chain estimators (``gear`` reweights a GRPO
advantage; ``tips`` shapes rewards that masked GAE then turns into advantages), so each entry lists them in the
order they are applied. ``loss_agg`` is the ``policy_loss`` aggregation the method's preset trains with (the paper's, except where a
comment says otherwise; ``tests/credit/test_credit_registry.py`` ties every preset to it), and
``needs_critic`` says whether the method reads a value head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from agentcredit.credit.carl_critical import critical_action_advantages
from agentcredit.credit.carl_segment import segment_advantages
from agentcredit.credit.gae import gae_advantages
from agentcredit.credit.gear import gear_advantages
from agentcredit.credit.gigpo import gigpo_advantages
from agentcredit.credit.grpo import grpo_advantages
from agentcredit.credit.portool import portool_advantages
from agentcredit.credit.tips import tips_turn_rewards

__all__ = ["CreditPreset", "PRESETS", "get_preset"]


@dataclass(frozen=True)
class CreditPreset:
    """How one method turns a rollout into advantages."""

    name: str
    estimators: tuple[Callable[..., Any], ...]  # applied in this order
    loss_agg: str  # a policy_loss aggregation
    needs_critic: bool
    source: str  # where the formulas come from


PRESETS: Mapping[str, CreditPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            # token-mean, verl's default, is what agentcredit's grpo trains with (configs/methods/grpo.yaml); the
            # paper's Eq. 3 is seq-mean-token-mean, available as algorithm.loss_agg=seq-mean-token-mean.
            CreditPreset("grpo", (grpo_advantages,), "token-mean", False, "GRPO, Shao et al. 2024 Eq. 3"),
            CreditPreset("ppo", (gae_advantages,), "token-mean", True, "PPO + GAE, verl multi-turn GAE"),
            CreditPreset(
                "carl-segment", (segment_advantages,), "segment-mean", True, "carl-segment Eqs. 1, 3, 6"
            ),
            CreditPreset(
                "carl-critical",
                (critical_action_advantages,),
                "token-mean",
                False,
                "carl-critical Eqs. 9-13, 2",
            ),
            CreditPreset(
                "portool", (portool_advantages,), "seq-mean-token-mean", False, "PORTool Eqs. 1-3, Thm 3.1"
            ),
            CreditPreset(
                "tips", (tips_turn_rewards, gae_advantages), "token-mean", True, "TIPS Eqs. 17-20, Table 10"
            ),
            CreditPreset(
                "gear", (grpo_advantages, gear_advantages), "seq-mean-token-mean", False, "GEAR Eqs. 2-6"
            ),
            CreditPreset(
                "gigpo",
                (gigpo_advantages,),
                "token-mean",
                False,
                "GiGPO, Feng et al. 2025 (verl-agent gigpo)",
            ),
        )
    }
)


def get_preset(name: str) -> CreditPreset:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown credit preset {name!r}; known presets: {', '.join(PRESETS)}") from None
