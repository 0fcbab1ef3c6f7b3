"""A lagged teacher on verl (TIPS's): inference replicas serving a snapshot of the actor, refreshed every N updates.

Keyed by the signal, never the method: the teacher scores ``potentials`` for the method's part that needs them, on
that part's settings (``refresh_every``, ``teacher_replicas``; its keys ``agentcredit.<section>.<key>``).

The paper's teacher is a frozen copy of the policy, refreshed every N = 200 updates and fixed within a batch
(tips.md §3.8); the native trainer keeps it as a second model. On verl it is built from verl's own parts:

* the replicas are verl's teacher replicas (``RolloutReplica(is_teacher_model=True)``, as its distillation teachers),
  launched standalone as ``LLMServerManager`` launches a separate rollout (``init_standalone``: a placement group of
  their own, outside the trainer's pool, so the cluster needs :func:`teacher_gpus` more GPUs), with the rollout's
  engine, parallelism and limits;
* their weights come from the actor through a ``CheckpointEngineManager`` over the configured transport
  (``actor_rollout_ref.rollout.checkpoint_engine.backend``, e.g. nccl), as verl's separate-async trainer
  refreshes its standalone replicas, and before the colocated rollout wakes (so the transfer buffers never share the
  GPU with vLLM's KV cache); the trainer refreshes them once before the first rollout (the initial policy, or the
  resumed one) and after every update the part's settings name due (``teacher_refresh_due``);
* their load balancer is verl's ``GlobalRequestLoadBalancer`` registered under the Ray name
  :data:`TEACHER_ROUTER`, because verl builds agent loops with the rollout client only: the agent loop finds the
  teacher by that name (:func:`teacher_client`).

With ``agentcredit.tips.refresh_every=1`` none of this runs: the teacher is the current policy, which the
rollout server already serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import ray
from omegaconf import DictConfig
from verl.checkpoint_engine import CheckpointEngineManager
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.ray_utils import auto_await
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import RolloutReplica, get_rollout_replica_class
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from agentcredit.credit import get_method
from agentcredit.integrations.verl.settings import AgentCreditSettings

__all__ = [
    "TEACHER_ROUTER",
    "LaggedTeacher",
    "check_lagged_teacher",
    "check_teacher_gpus",
    "teacher_client",
    "teacher_gpus",
    "teacher_step_metric",
    "wants_lagged_teacher",
]

logger = logging.getLogger(__name__)

#: The signal the lagged teacher scores.
SCORED = "potentials"
#: Ray name of the lagged teacher's load balancer (one training job per Ray namespace, as verl's own actors).
TEACHER_ROUTER = "agentcredit_lagged_teacher_router"
#: Suffix of the teacher replicas' Ray names, beside verl's distillation teachers' ``rollout_teacher_*``.
_NAME_SUFFIX = "agentcredit_lagged_teacher"


def _section(settings: AgentCreditSettings) -> str:
    """The config section of the method's part whose teacher scores the potentials."""
    return next(p.section for p in get_method(settings.method).parts if SCORED in p.needs.signals)


def wants_lagged_teacher(settings: AgentCreditSettings) -> bool:
    """A method whose teacher lags the policy (``refresh_every > 1``): the trainer launches :class:`LaggedTeacher`
    and the agent loop scores the potentials on it; otherwise the rollout server (the current policy) scores them."""
    return SCORED in settings.needs.signals and settings.settings_for(SCORED).refresh_every > 1


def teacher_step_metric(settings: AgentCreditSettings) -> str:
    """The metric of the actor step whose weights scored a batch's potentials: ``agentcredit/<section>_teacher_step``,
    the section of the method's part that needs them."""
    return f"agentcredit/{_section(settings)}_teacher_step"


def check_lagged_teacher(config: DictConfig, settings: AgentCreditSettings) -> None:
    """Raise with the key to change when verl's config cannot host the lagged teacher."""
    if not wants_lagged_teacher(settings):
        return
    rollout = config.actor_rollout_ref.rollout
    key = f"agentcredit.{_section(settings)}.refresh_every"
    fallback = f"or {key}=1 to score on the rollout server (the current policy)"
    if rollout.checkpoint_engine.backend == "naive":
        raise ValueError(
            f"{key}={settings.settings_for(SCORED).refresh_every} keeps a lagged teacher on replicas of its "
            "own, which the actor's weights reach over a transport: set actor_rollout_ref.rollout.checkpoint_engine"
            f".backend=nccl (or nixl; 'naive' only reaches colocated replicas), {fallback}"
        )
    if rollout.name == "trtllm":  # verl's TRTLLMReplica raises NotImplementedError for is_teacher_model
        raise ValueError(
            "the lagged teacher runs on verl's teacher replicas, which trtllm does not provide: set "
            f"actor_rollout_ref.rollout.name=vllm (or sglang), {fallback}"
        )


def teacher_gpus(config: DictConfig, settings: AgentCreditSettings) -> int:
    """GPUs the lagged teacher's replicas take beside the trainer's pool (0 when the teacher is the policy)."""
    if not wants_lagged_teacher(settings):
        return 0
    rollout = config.actor_rollout_ref.rollout
    world = (
        int(rollout.tensor_model_parallel_size)
        * int(rollout.get("data_parallel_size", 1))
        * int(rollout.get("pipeline_model_parallel_size", 1))
    )
    return settings.settings_for(SCORED).teacher_replicas * world


def check_teacher_gpus(config: DictConfig, settings: AgentCreditSettings, cluster_gpus: float) -> None:
    """Refuse, before any worker starts, a cluster without GPUs for both the trainer's pool and the teacher's
    replicas (their placement groups are their own; verl would otherwise fail after building every worker)."""
    needed = teacher_gpus(config, settings)
    if not needed:
        return
    pool = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    section = _section(settings)
    if pool + needed > cluster_gpus:
        raise ValueError(
            f"the lagged teacher needs {needed} GPUs of its own (agentcredit.{section}.teacher_replicas="
            f"{settings.settings_for(SCORED).teacher_replicas} x the rollout's tensor x data x pipeline parallel "
            f"size) beside the trainer's {pool} (trainer.nnodes x trainer.n_gpus_per_node), but the Ray cluster has "
            f"{cluster_gpus:g}: lower trainer.n_gpus_per_node, or set agentcredit.{section}.refresh_every=1 to score "
            "on the rollout server (the current policy)"
        )


@auto_await
async def _launch(replicas: list[RolloutReplica]) -> None:
    await asyncio.gather(*(replica.init_standalone() for replica in replicas))


class LaggedTeacher:
    """The teacher replicas, their named load balancer, and the weight sync from the actor."""

    def __init__(
        self,
        replicas: list[RolloutReplica],
        router: Any,
        sync: CheckpointEngineManager,
        every: int,
        due: Callable[[int], bool],
    ):
        self.replicas = replicas
        self.router = router
        self.sync = sync
        self.every = every
        # due(updates_done): whether the teacher is refreshed after that update (the method's schedule)
        self.due = due
        self.weights_step: int | None = None  # the actor step whose weights the teacher serves

    @classmethod
    def launch(cls, config: DictConfig, actor_wg: Any, settings: AgentCreditSettings) -> LaggedTeacher:
        """Start ``teacher_replicas`` replicas (random weights until :meth:`refresh`)."""
        part = settings.settings_for(SCORED)
        rollout = config.actor_rollout_ref.rollout
        replica_cls = get_rollout_replica_class(rollout.name)
        replicas = [
            replica_cls(
                replica_rank=rank,
                config=rollout,
                model_config=config.actor_rollout_ref.model,
                gpus_per_node=int(rollout.n_gpus_per_node),
                is_teacher_model=True,
                name_suffix=_NAME_SUFFIX,
            )
            for rank in range(part.teacher_replicas)
        ]
        _launch(replicas)
        servers = {replica._server_address: replica._server_handle for replica in replicas}
        router = (  # as verl's get_router_handle builds it, under a name the agent loops can find
            ray.remote(GlobalRequestLoadBalancer)
            .options(name=TEACHER_ROUTER)
            .remote(
                servers=servers,
                max_cache_size=DEFAULT_ROUTING_CACHE_SIZE,
                full_determinism=bool(rollout.get("full_determinism", False)),
            )
        )
        sync = CheckpointEngineManager(
            config=omega_conf_to_dataclass(rollout.checkpoint_engine), actor_wg=actor_wg, replicas=replicas
        )
        logger.info("lagged teacher: %d replicas at %s", len(replicas), list(servers))
        return cls(replicas, router, sync, part.refresh_every, part.teacher_refresh_due)

    def refresh(self, global_steps: int) -> dict[str, Any]:
        """The teacher becomes the actor as it is now (between batches only); the transport's sync metrics."""
        metrics = self.sync.update_weights(global_steps) or {}
        self.weights_step = int(global_steps)
        return dict(metrics)

    def after_update(self, global_steps: int) -> dict[str, Any] | None:
        """Refresh after the ``global_steps``-th update when the schedule says so: its sync metrics, else None."""
        if not self.due(global_steps):
            return None
        return self.refresh(global_steps)


def teacher_client(config: DictConfig) -> LLMServerClient:
    """A client of the lagged teacher the trainer launched, found by its load balancer's Ray name."""
    try:
        router = ray.get_actor(TEACHER_ROUTER)
    except ValueError:
        raise RuntimeError(
            "refresh_every > 1 scores the potentials on the lagged teacher, but no actor "
            f"named {TEACHER_ROUTER!r} is running: it is started by the agentcredit trainer "
            "(trainer.v1.trainer_mode=agentcredit)"
        ) from None
    return LLMServerClient(config=config, load_balancer_handle=router)
