"""Register agentcredit's estimators, agent loop and trainer in verl's registries.

agentcredit's package declares this module as its ``verl.plugins`` entry point (``pyproject.toml``), and verl 0.9.1
loads that group at ``import verl``: every process that imports verl (the driver that composes the config, the
TaskRunner, every Ray worker) imports it, with nothing to export. Registries are per process, which is why it must
be every process. Importing this module twice is harmless (Python caches modules, and verl's registries accept
re-registering the same object).

Registered names:

* ``algorithm.adv_estimator``: ``agentcredit_grpo``, ``agentcredit_drgrpo`` (:mod:`.estimators`)
* agent loop: ``agentcredit_agent`` (:mod:`.agent_loop`)
* ``trainer.v1.trainer_mode``: ``agentcredit`` (:mod:`.trainer`)
* under ``VERL_PLATFORM=cpu``: the ``cpu`` platform, engines and rollout of :mod:`.cpu`
* OmegaConf resolver ``agentcredit_needs``: the verl keys a method's Needs decide (:func:`.settings.verl_keys`)
"""

from __future__ import annotations

import os

if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
    # verl on the CPU (agentcredit.integrations.verl.cpu): the platform, engines, rollout and rebinds, in every
    # process that imports verl (the driver too: main_ppo sets trainer.device from the detected platform). First:
    # the modules below import verl modules that ask for the platform at import
    from agentcredit.integrations.verl import cpu  # noqa: F401, I001

from agentcredit.integrations.verl import agent_loop, estimators, trainer  # noqa: E402
from agentcredit.integrations.verl.settings import register_needs_resolver  # noqa: E402

register_needs_resolver()  # config/agentcredit_base.yaml's ${agentcredit_needs:...} keys

__all__ = ["agent_loop", "estimators", "trainer"]
