"""Credit assignment: pure functions from rewards, values and trees to advantages, plus the PPO loss.

One module per method; nothing here imports models, tokenizers, tools or I/O. Tensor arguments may be float32
or float64 (results keep the input's float dtype) and masks may be bool or 0/1 tensors. Bad input raises a
``ValueError`` naming the argument.

Example::

    import torch
    from agentcredit.credit import grpo_advantages, segment_advantages

    grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), ["q1", "q1", "q2", "q2"])
    segment_advantages([0.40, 0.70, 0.50], reward=1.0)   # invoke +0.3, assimilate -0.2, commit +0.5
"""

from agentcredit.credit.estimators import (
    DecisionTree,
    Episode,
    EpisodeBatch,
    Estimate,
    Step,
    chain_trees,
)
from agentcredit.credit.loss import (
    LOSS_AGGREGATIONS,
    aggregation_weights,
    policy_loss,
    policy_loss_stats,
    split_policy_loss,
)
from agentcredit.credit.methods import (
    METHODS,
    SIGNALS,
    Method,
    Needs,
    Settings,
    compose,
    get_method,
    register_method,
    register_signal,
    resolve_method,
)
from agentcredit.credit.methods.carl_critical import (
    UPDATE_RULES,
    critical_action_advantages,
    critical_action_outcome_advantages,
)
from agentcredit.credit.methods.carl_segment import segment_advantages
from agentcredit.credit.methods.gear import gear_reweight, gear_reweight_stats
from agentcredit.credit.methods.gear.maths import SEGMENTATIONS, GearDetails, gear_advantages, gear_details
from agentcredit.credit.methods.gigpo import gigpo_advantages  # public since before issue 37
from agentcredit.credit.methods.grpo import grpo_advantages
from agentcredit.credit.methods.portool.maths import (
    AGGREGATORS,
    W2_MODES,
    PortoolTerms,
    portool_advantage_terms,
    portool_advantages,
)
from agentcredit.credit.methods.ppo import gae_advantages
from agentcredit.credit.methods.tips import (
    tips_batch_alpha,
    tips_potential,
    tips_step_alpha,
    tips_step_rewards,
    tips_teacher_refresh_due,
    tips_token_rewards,
    tips_turn_rewards,
)

__all__ = [
    # the eight functions of the public contract
    "grpo_advantages",
    "gae_advantages",
    "segment_advantages",
    "critical_action_advantages",
    "portool_advantages",
    "tips_turn_rewards",
    "gear_advantages",
    "policy_loss",
    # the step-level baseline of verl-agent
    "gigpo_advantages",
    # options, details and helpers
    "critical_action_outcome_advantages",
    "UPDATE_RULES",
    "portool_advantage_terms",
    "PortoolTerms",
    "AGGREGATORS",
    "W2_MODES",
    "tips_potential",
    "tips_batch_alpha",
    "tips_step_alpha",
    "tips_token_rewards",
    "tips_teacher_refresh_due",
    "gear_details",
    "GearDetails",
    "SEGMENTATIONS",
    "policy_loss_stats",
    "split_policy_loss",
    "aggregation_weights",
    "LOSS_AGGREGATIONS",
    # the neutral per-episode layout both trainers build
    "Estimate",
    "EpisodeBatch",
    "Episode",
    "Step",
    "DecisionTree",
    "chain_trees",
    "tips_step_rewards",
    "gear_reweight",
    "gear_reweight_stats",
    # the methods both trainers call (one object each, agentcredit.credit.methods)
    "METHODS",
    "Method",
    "Needs",
    "Settings",
    "compose",
    "get_method",
    "resolve_method",
    "register_method",
    # the signals a method's Needs may name, and how to add one
    "SIGNALS",
    "register_signal",
]
