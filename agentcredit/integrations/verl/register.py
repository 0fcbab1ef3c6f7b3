"""Register agentcredit's estimators, agent loop and trainer in verl's registries.

List this module in ``VERL_USE_EXTERNAL_MODULES``: ``import verl`` then imports it in every process that imports
verl. Registries are per process, so the variable must reach the Ray workers too; the shipped configs put it in
``ray_kwargs.ray_init.runtime_env.env_vars``. Importing this module twice is harmless (Python caches modules,
and verl's registries accept re-registering the same object).

Registered names:

* ``algorithm.adv_estimator``: ``agentcredit_grpo``, ``agentcredit_drgrpo`` (:mod:`.estimators`)
* agent loop: ``agentcredit_agent`` (:mod:`.agent_loop`)
* ``trainer.v1.trainer_mode``: ``agentcredit`` (:mod:`.trainer`)
* OmegaConf resolver ``agentcredit_needs``: the verl keys a method's Needs decide (:func:`.settings.verl_keys`)
"""

from __future__ import annotations

from agentcredit.integrations.verl import agent_loop, estimators, trainer
from agentcredit.integrations.verl.settings import register_needs_resolver

register_needs_resolver()  # config/agentcredit_base.yaml's ${agentcredit_needs:...} keys

__all__ = ["agent_loop", "estimators", "trainer"]
