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

import importlib

from agentcredit.credit import methods
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
    BUILT_IN,
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
from agentcredit.credit.signals import ProviderContext, SignalProvider, register_provider


def _homes_public() -> dict[str, object]:
    """What each built-in method's home makes public (its ``__all__``, the ``METHOD`` object aside: that one is
    ``METHODS[name]``), so a method's maths is importable from here without this file naming it."""
    public: dict[str, object] = {}
    for name in BUILT_IN:
        home = importlib.import_module(f"{methods.__name__}.{name.replace('-', '_')}")
        for attr in getattr(home, "__all__", ()):
            if attr != "METHOD":
                public[attr] = getattr(home, attr)
    return public


_PUBLIC = _homes_public()
globals().update(_PUBLIC)

__all__ = [
    "policy_loss",
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
    # the methods both trainers call (one object each, agentcredit.credit.methods)
    "BUILT_IN",
    "METHODS",
    "Method",
    "Needs",
    "Settings",
    "compose",
    "get_method",
    "resolve_method",
    "register_method",
    # the signals a method's Needs may name, and how to add one and its provider
    "SIGNALS",
    "register_signal",
    "SignalProvider",
    "ProviderContext",
    "register_provider",
    # each built-in method's public maths, options and details (the ``__all__`` of its home)
    *_PUBLIC,
]
