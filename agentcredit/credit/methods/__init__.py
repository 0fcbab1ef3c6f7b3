"""The credit methods, one module each: settings, needs, the estimate or modifier, and optional hooks.

``METHODS[name]`` is what both trainers call (:class:`~agentcredit.credit.methods.base.Method`); a method from
your own package joins them with :func:`register_method` (``docs/adding-a-method.md``).
"""

from agentcredit.credit.methods import carl_critical, carl_segment, gear, gigpo, grpo, portool, ppo, tips
from agentcredit.credit.methods.base import (
    METHODS,
    Method,
    Needs,
    NoSettings,
    Settings,
    compose,
    estimator_names,
    get_method,
    method_for_parts,
    modifier_names,
    register_method,
    unregister_method,
)

for _module in (grpo, ppo, carl_segment, carl_critical, portool, tips, gear, gigpo):
    register_method(_module.METHOD)

__all__ = [
    "METHODS",
    "Method",
    "Needs",
    "NoSettings",
    "Settings",
    "compose",
    "estimator_names",
    "get_method",
    "method_for_parts",
    "modifier_names",
    "register_method",
    "unregister_method",
]
