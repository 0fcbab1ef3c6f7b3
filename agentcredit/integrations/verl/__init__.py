"""agentcredit inside an unmodified verl install (verl 0.9.1, the V1 trainer).

What plugs in where (docs/scaling-out-with-verl.md has the full picture):

* :mod:`.register` is the package's ``verl.plugins`` entry point. ``import verl`` imports it in every process (the
  driver, the TaskRunner and every Ray worker), and it registers everything below.
* :mod:`.agent_loop`: the agent loop ``agentcredit_agent`` runs agentcredit's protocols and tools inside
  verl's rollout and records what the credit methods need in ``extra_fields["agentcredit"]``
  (:mod:`.fields`).
* :mod:`.trainer`: the V1 trainer ``agentcredit`` (``trainer.v1.trainer_mode=agentcredit``) whose
  ``_compute_advantage`` hands verl's batch to :mod:`.advantages`, which calls agentcredit's credit functions.
* :mod:`.estimators`: ``@register_adv_est`` estimators for the methods that fit verl's narrow estimator
  interface (rewards, response mask and uid only).
* ``config/*.yaml``: Hydra configs that extend verl's own tree through ``searchpath``: ``agentcredit.yaml`` runs any
  registered method (``agentcredit.method=<name>``; the verl keys its Needs decide follow from it), the others are
  paper recipes (:data:`METHOD_CONFIGS`).

Nothing in this package is imported by agentcredit's core, and this ``__init__`` imports no verl module, so
``import agentcredit`` never pulls verl in.
"""

from __future__ import annotations

from pathlib import Path

from agentcredit.credit.methods import BUILT_IN, METHODS

__all__ = [
    "AGENT_LOOP_NAME",
    "ESTIMATOR_NAMES",
    "EXTRA_KEY",
    "GENERIC_CONFIG",
    "METHOD_CONFIGS",
    "REGISTER_MODULE",
    "TRAINER_NAME",
    "VERL_VERSION",
    "config_dir",
    "config_name",
]

#: The verl release this integration is written and tested against (the ``agentcredit[verl]`` extra pins it).
VERL_VERSION = "0.9.1"
#: The module of the ``verl.plugins`` entry point (``pyproject.toml``), which verl imports at ``import verl``.
REGISTER_MODULE = "agentcredit.integrations.verl.register"
#: ``actor_rollout_ref.rollout.agent.default_agent_loop`` / the ``agent_name`` column of the data.
AGENT_LOOP_NAME = "agentcredit_agent"
#: ``trainer.v1.trainer_mode``.
TRAINER_NAME = "agentcredit"
#: ``algorithm.adv_estimator`` names registered in verl's estimator registry: each built-in method's outcome
#: estimators (``Method.outcome_estimators``), as ``agentcredit_<name>``.
ESTIMATOR_NAMES = tuple(f"agentcredit_{name}" for m in BUILT_IN for name, _ in METHODS[m].outcome_estimators)
#: The key of ``AgentLoopOutput.extra_fields`` that carries agentcredit's per-row record.
EXTRA_KEY = "agentcredit"
#: The Hydra config that runs any registered method: ``--config-name agentcredit agentcredit.method=<name>``.
GENERIC_CONFIG = "agentcredit"


def config_dir() -> Path:
    """Directory of the Hydra configs (pass it to verl's entry point as ``--config-path``)."""
    return Path(__file__).resolve().parent / "config"


#: Built-in method -> its paper recipe under :func:`config_dir` (``<its name in snake_case>.yaml``), for the
#: methods that ship one. A recipe is optional: without one a method runs from :data:`GENERIC_CONFIG`.
METHOD_CONFIGS = {
    name: name.replace("-", "_")
    for name in BUILT_IN
    if (config_dir() / f"{name.replace('-', '_')}.yaml").is_file()
}


def config_name(method: str) -> str:
    """The Hydra config to run ``method`` with: its recipe, else :data:`GENERIC_CONFIG` (with
    ``agentcredit.method=<method>``)."""
    return METHOD_CONFIGS.get(method, GENERIC_CONFIG)
