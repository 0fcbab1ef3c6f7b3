"""The V1 trainer ``agentcredit``: verl's synchronous PPO trainer with agentcredit's advantages.

Select it with ``trainer.v1.trainer_mode=agentcredit``; once verl has picked the class, the trainer sets the mode
to ``sync``, so verl runs its synchronous path. Everything but the advantage step is verl's ``PPOTrainerSync``:
rollout through the agent loop, old log-probs and entropies from the actor, reference log-probs, critic values,
the critic and actor updates. ``_compute_advantage`` reads from TransferQueue what
the credit methods need (values, old and rollout log-probs, entropies, and the agent loop's
``extra_fields["agentcredit"]`` record), hands them to :func:`agentcredit.integrations.verl.advantages
.apply_to_dataproto`, and writes ``advantages`` and ``returns`` back exactly where verl's own step puts them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from functools import partial
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.utils.padding import response_to_nested

from agentcredit.credit import get_method
from agentcredit.integrations.verl import EXTRA_KEY, TRAINER_NAME
from agentcredit.integrations.verl.advantages import apply_to_dataproto
from agentcredit.integrations.verl.data import check_data_files
from agentcredit.integrations.verl.fields import TEACHER_FIELD
from agentcredit.integrations.verl.losses import (
    LOSS_WEIGHTS,
    VALUE_WEIGHTS,
    boundary_value_loss,
    trajectory_weighted_actor_loss,
)
from agentcredit.integrations.verl.minibatch import MinibatchPlan, plan_minibatches
from agentcredit.integrations.verl.settings import AgentCreditSettings, load_settings
from agentcredit.integrations.verl.teacher import (
    LaggedTeacher,
    check_lagged_teacher,
    check_teacher_gpus,
    teacher_step_metric,
    wants_lagged_teacher,
)

__all__ = [
    "TEACHER_FIELD",
    "AgentCreditTrainer",
    "check_trainer_config",
    "episode_keys",
    "fields_to_dataproto",
    "teacher_to_tensor_field",
]

logger = logging.getLogger(__name__)

#: verl's name for the synchronous V1 mode, the one PPOTrainerSync (and so this trainer) runs.
SYNC_MODE = "sync"


def check_trainer_config(config: DictConfig) -> AgentCreditSettings:
    """Validate the ``agentcredit`` block against the rest of verl's config; raise with the key to change."""
    if "agentcredit" not in config:
        raise ValueError(
            "trainer.v1.trainer_mode=agentcredit needs an `agentcredit:` block; start from one of the configs in "
            "agentcredit/integrations/verl/config (--config-name <method>, its section's name)"
        )
    settings = load_settings(config.agentcredit)
    if config.algorithm.get("use_kl_in_reward", False):
        raise ValueError(
            "algorithm.use_kl_in_reward=True is not supported by the agentcredit trainer: the credit methods "
            "define their own token rewards; use actor_rollout_ref.actor.use_kl_loss=True (the papers' KL loss)"
        )
    enabled = config.critic.get("enable")
    has_critic = bool(enabled) if enabled is not None else config.algorithm.adv_estimator == "gae"
    if settings.needs.critic != "none" and not has_critic:
        raise ValueError(f"agentcredit.method={settings.method} needs a critic: set critic.enable=True")
    method = get_method(settings.method)
    errors = method.trainer_errors("verl", config, method.settings_from(settings))  # each part's own checks
    if errors:
        raise ValueError(errors[0])
    _check_tree(config, settings)
    check_lagged_teacher(config, settings)
    agent = config.actor_rollout_ref.rollout.get("agent", {})
    if agent.get("default_agent_loop") != "agentcredit_agent":
        logger.warning(
            "actor_rollout_ref.rollout.agent.default_agent_loop is %r; rows from other agent loops carry no "
            "agentcredit record and will be rejected unless the data's agent_name column selects agentcredit_agent",
            agent.get("default_agent_loop"),
        )
    return settings


def _check_tree(config: DictConfig, settings: AgentCreditSettings) -> None:
    """A tree strategy grows each prompt's tree in one session (:meth:`AgentCreditTrainer._fetch_one_gen_batch`)
    with one output per leaf, so verl's ``rollout.n`` (the rows of one prompt in its batch arithmetic) must be the
    leaf count."""
    tree = settings.tree
    if tree.strategy == "independent":
        return
    n = int(config.actor_rollout_ref.rollout.n)
    if n != tree.leaves():
        raise ValueError(
            f"agentcredit.tree.strategy={tree.strategy} grows {tree.leaves()} leaves per prompt (one output each); set "
            f"actor_rollout_ref.rollout.n={tree.leaves()} (now {n}) so verl's mini-batches count them"
        )
    if settings.tools.environment is not None:
        raise ValueError(
            "agentcredit.tree and agentcredit.tools.environment are not combined on verl: a branch would need the "
            "environment replayed (the native trainer does that); use agentcredit.tree.strategy=independent"
        )


#: The sections whose per-GPU micro-batch sizes verl cuts a rank's rows by when dynamic batch sizes are off
#: (``prepare_micro_batches`` asserts they divide evenly): (section, its use_dynamic_bsz key). A size is every key of
#: the section named ``*micro_batch_size_per_gpu``, verl's suffix for them, whose prefixes differ by pass and
#: version (the critic's value pass: forward_micro_batch_size_per_gpu in verl's YAML,
#: ppo_infer_micro_batch_size_per_gpu in its CriticConfig), so a key verl adds is not missed; the same rule
#: test_verl_minibatch checks the plan by.
_MICRO_BATCH_SECTIONS = (
    ("actor_rollout_ref.actor", "use_dynamic_bsz"),
    ("actor_rollout_ref.rollout", "log_prob_use_dynamic_bsz"),
    ("actor_rollout_ref.ref", "log_prob_use_dynamic_bsz"),
    ("critic", "use_dynamic_bsz"),
)
MICRO_BATCH_SUFFIX = "micro_batch_size_per_gpu"


def micro_batch_multiple(config: DictConfig, use_critic: bool) -> int:
    """The least common multiple of the per-GPU micro-batch sizes verl will cut each rank's rows by (1 with dynamic
    batch sizes): a rank's share of every planned mini-batch must be a multiple of it, or verl's divisibility
    assertion fires at the first update or log-prob pass (carl-segment's 2 rows per micro-batch, 8 GPUs,
    120 rows -> 15 per rank)."""
    from omegaconf import OmegaConf

    sizes = []
    for section, dynamic in _MICRO_BATCH_SECTIONS:
        if section == "critic" and not use_critic:
            continue
        node = OmegaConf.select(config, section)
        if node is None or node.get(dynamic, False):
            continue
        # keys first, values of the matching ones only (another key's interpolation may not resolve here)
        names = [k for k in node.keys() if str(k).endswith(MICRO_BATCH_SUFFIX)]
        sizes += [int(node[k]) for k in names if node.get(k) is not None]
    return math.lcm(*sizes) if sizes else 1


def episode_keys(extra_fields: list, keys: list) -> list:
    """The episode of every row: the agentcredit record's ``episode_id``, else the row's own key."""
    out = []
    for extra, key in zip(extra_fields, keys, strict=True):
        record = (extra or {}).get(EXTRA_KEY) or {}
        episode = record.get("episode_id") if isinstance(record, dict) else None
        out.append(("episode", episode) if episode else ("row", key))
    return out


def teacher_to_tensor_field(extra_fields: list) -> tuple[list, list[torch.Tensor]] | None:
    """Every row's ``extra_fields`` without the record's ``teacher_logprobs``, and those log-probs as one float32
    tensor per row (empty for a row without them); None when no row carries any (nothing to move)."""
    if not any(((e or {}).get(EXTRA_KEY) or {}).get("teacher_logprobs") is not None for e in extra_fields):
        return None
    new_extra, tensors = [], []
    for extra in extra_fields:
        extra = dict(extra or {})
        record = extra.get(EXTRA_KEY)
        values = None
        if isinstance(record, dict):
            values = record.get("teacher_logprobs")
            extra[EXTRA_KEY] = {**record, "teacher_logprobs": None}
        new_extra.append(extra)
        tensors.append(torch.tensor(values if values is not None else [], dtype=torch.float32))
    return new_extra, tensors


def _as_list(values: Any) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def fields_to_dataproto(data: TensorDict) -> DataProto:
    """The TransferQueue fields of a batch (nested per-row tensors, ``uid``, ``extra_fields``) as a padded
    ``DataProto`` with ``uid`` and the agentcredit records in ``non_tensor_batch``, as the adapter reads it."""
    extra = _as_list(data.pop("extra_fields"))
    uids = _as_list(data.pop("uid"))
    proto = DataProto(batch=data.to_padded_tensor())
    proto.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    records = np.empty(len(extra), dtype=object)
    records[:] = [(e or {}).get(EXTRA_KEY) for e in extra]
    proto.non_tensor_batch[EXTRA_KEY] = records
    return proto


@register_trainer(TRAINER_NAME)
class AgentCreditTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` whose advantage step calls agentcredit's credit functions."""

    def __init__(self, config: DictConfig):
        self.agentcredit = check_trainer_config(config)
        # verl uses trainer_mode for two things: main_ppo looks the trainer class up by it (that chose this class),
        # and PPOTrainer.__init__ keeps it as self.trainer_mode, which every later branch compares with "sync"
        # (replay buffer, data.gen_batch_size, TransferQueue checkpoints). Left as "agentcredit", this trainer
        # would take the async branches; it is PPOTrainerSync, so from here on verl must see the sync mode.
        with open_dict(config):
            config.trainer.v1.trainer_mode = SYNC_MODE
        super().__init__(config)
        # the method's state carried between batches (Method.batch_signals: TIPS's batch_target alpha)
        self._method_state: dict[str, Any] | None = None
        self._plan: MinibatchPlan | None = None  # this step's mini-batches of whole episodes, if multi-row
        self._teacher_field = False  # this step's teacher log-probs are in TEACHER_FIELD (_balance_batch)
        self._teacher: LaggedTeacher | None = None  # a lagged teacher, refresh_every > 1 (launched in _setup)

    def _init_dataloader(self):
        """verl's datasets, once their prompts are known to ask for the format the method's protocol parses."""
        for key in ("train_files", "val_files"):
            check_data_files(
                self.config.data.get(key), self.agentcredit.protocol, self.agentcredit.protocol_options
            )
        return super()._init_dataloader()

    def _setup(self):
        if wants_lagged_teacher(self.agentcredit):  # before any worker starts
            check_teacher_gpus(self.config, self.agentcredit, ray.cluster_resources().get("GPU", 0))
        super()._setup()
        if wants_lagged_teacher(self.agentcredit):
            self._teacher = LaggedTeacher.launch(self.config, self.actor_rollout_wg, self.agentcredit)

    def on_init_end(self):
        """After the workers start, agentcredit's losses replace verl's where a boundary critic needs its own
        (verl's ``set_loss_fn`` hook, :mod:`.losses`): the critic regresses sigmoid(V) on R at the segment
        boundaries, and with ``segment_mean_loss`` the actor's entropy and KL terms get the segment-mean weights too.
        A lagged teacher gets the actor's weights (the initial policy, or the checkpoint resumed from)."""
        if self.agentcredit.needs.critic == "boundary":
            critic = omega_conf_to_dataclass(self.config.critic)
            self.critic_wg.set_loss_fn(partial(boundary_value_loss, config=critic))
            if self.agentcredit.settings_for("boundary").segment_mean_loss:
                actor = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
                self.actor_rollout_wg.set_loss_fn(partial(trajectory_weighted_actor_loss, config=actor))
        # the teacher first, while the colocated rollout is still asleep (as _setup left it)
        if self._teacher is not None:
            if self.global_steps % self._teacher.every:
                # the native trainer's checkpoint holds the teacher; verl's holds the actor only
                logger.warning(
                    "resumed at step %d: the lagged teacher is the resumed policy until the next refresh, not the "
                    "snapshot of step %d",
                    self.global_steps,
                    self.global_steps - self.global_steps % self._teacher.every,
                )
            self._teacher.refresh(self.global_steps)
        super().on_init_end()

    def on_step_end(self):
        """The lagged teacher's refresh when one is due, then verl's weight update of the rollout replicas: the teacher's
        transfer runs while the colocated rollout sleeps (as verl's separate-async trainer orders its two syncs)."""
        synced = None
        if self._teacher is not None:
            with marked_timer("agentcredit_teacher_refresh", self.timing_raw, color="red"):
                synced = self._teacher.after_update(self.global_steps)
        super().on_step_end()
        if synced:
            pending = getattr(self, "_pending_sync_metrics", None) or {}
            self._pending_sync_metrics = {
                **pending,
                **{f"agentcredit/teacher_sync/{k}": v for k, v in synced.items()},
            }

    #: The trainer's own state in a verl checkpoint folder (``global_step_N/``), beside verl's ``data.pt``.
    STATE_FILE = "agentcredit_state.json"

    def _state_folder(self) -> str:
        if self.config.trainer.resume_mode == "resume_path" and self.config.trainer.get("resume_from_path"):
            folder = str(self.config.trainer.resume_from_path)
        else:
            folder = os.path.join(
                str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}"
            )
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _save_checkpoint(self):
        """verl's checkpoint plus the trainer's own state: the method's state carried between batches
        (:attr:`Method.batch_signals`; TIPS's batch_target alpha, which carries over a batch without non-zero
        deltas). Written before verl's, so a checkpoint verl marks as latest always has it."""
        folder = self._state_folder()
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, self.STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(self._method_state or {}, f)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.global_steps:
            path = os.path.join(self._state_folder(), self.STATE_FILE)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    self._method_state = json.load(f)
            else:
                logger.warning(
                    "%s not found: a checkpoint of an older agentcredit; the method's state restarts", path
                )
        return out

    def _fetch_one_gen_batch(self):
        """verl's next prompts; under a tree strategy each is sent to one agent-loop session (``__rollout_n__`` =
        1, verl's per-prompt session count), which grows the prompt's whole tree and returns one output per leaf."""
        batch = super()._fetch_one_gen_batch()
        if self.agentcredit.tree.strategy != "independent":
            batch["__rollout_n__"] = torch.ones(len(batch), dtype=torch.long)
        return batch

    def _minibatch_episodes(self, section: str) -> int:
        cfg = self.config.actor_rollout_ref.actor if section == "actor" else self.config.critic
        return int(cfg.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's balancing, unless an episode spans several rows: then mini-batches of whole episodes.

        verl cuts each rank's slice into mini-batches of ``ppo_mini_batch_size x n`` rows; with multi-row
        episodes that changes the optimizer steps per epoch and splits episodes. The plan instead puts exactly
        ``ppo_mini_batch_size x n`` episodes in every mini-batch, pads all mini-batches to one row count, and
        the actor and critic updates below use that row count. verl's sequence-length balancing across ranks
        is given up for such batches (an episode's rows stay in order on the rank that gets them).
        """
        self._plan = None
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        extra = self._move_teacher_logprobs(batch, _as_list(data["extra_fields"]))
        episodes = episode_keys(extra, list(batch.keys))
        if len(set(episodes)) == len(episodes):  # one row per episode: verl's rows are trajectories
            return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        for key, section in (("actor_rollout_ref.actor", "actor"), ("critic", "critic")):
            if section == "critic" and not self.use_critic:
                continue
            cfg = self.config.actor_rollout_ref.actor if section == "actor" else self.config.critic
            if cfg.get("shuffle", False):
                raise ValueError(f"episodes with several rows need {key}.shuffle=False (verl shuffles rows)")
        actor_eps, critic_eps = self._minibatch_episodes("actor"), self._minibatch_episodes("critic")
        if self.use_critic and critic_eps % actor_eps:
            raise ValueError(
                f"episodes with several rows need critic.ppo_mini_batch_size ({critic_eps} episodes) to be a "
                f"multiple of actor_rollout_ref.actor.ppo_mini_batch_size ({actor_eps} episodes)"
            )
        role, worker_group = "actor", self.actor_rollout_wg
        if role not in worker_group._dispatch_info:
            worker_group._dispatch_info[role] = worker_group._query_dispatch_info(role)
        dp_size = max(worker_group._dispatch_info[role]) + 1
        plan = plan_minibatches(
            episodes,
            actor_eps,
            dp_size=dp_size,
            row_multiple=int(self.config.actor_rollout_ref.rollout.n),
            micro_batch_per_rank=micro_batch_multiple(self.config, self.use_critic),
        )
        n_real = len(batch)
        batch = upsample_batch_to_divisible_size(batch, len(plan.order), self.tokenizer.eos_token_id)
        pads = iter(range(n_real, len(batch)))
        batch.reorder([next(pads) if slot is None else slot for slot in plan.order])
        self._plan = plan
        metrics["agentcredit/minibatch_rows"] = float(plan.rows_per_minibatch)
        metrics["agentcredit/padding_rows"] = float(len(plan.order) - n_real)
        # episodes missing from a short last mini-batch (failed sessions): their slots weigh 0, the others nominal
        metrics["agentcredit/minibatch_missing_episodes"] = float(plan.missing_episodes)
        return batch

    def _move_teacher_logprobs(self, batch, extra_fields: list) -> list:
        """A teacher's per-token log-probs (GEAR's): before any worker call (this runs right after the rollout, and
        verl hands the whole batch, its
        ``extra_fields`` included, to every worker call), move the teacher's per-token log-probs out of the records
        into :data:`TEACHER_FIELD`, a tensor field the advantage step reads; returns the rows' ``extra_fields``."""
        self._teacher_field = False
        moved = teacher_to_tensor_field(extra_fields)
        if moved is None:
            return extra_fields
        new_extra, tensors = moved
        fields = list_of_dict_to_tensordict(
            [{"extra_fields": e, TEACHER_FIELD: t} for e, t in zip(new_extra, tensors, strict=True)]
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        self._teacher_field = True
        return new_extra

    @contextlib.contextmanager
    def _planned_minibatch(self, section: str):
        """verl's update reads its mini-batch rows from ppo_mini_batch_size x n: point it at the plan's rows."""
        if self._plan is None:
            yield
            return
        cfg = self.config.actor_rollout_ref.actor if section == "actor" else self.config.critic
        n = int(self.config.actor_rollout_ref.rollout.n)
        episodes = self._minibatch_episodes(section)
        rows = self._plan.rows_per_minibatch * (episodes // self._plan.episodes_per_minibatch)
        original = cfg.ppo_mini_batch_size
        with open_dict(cfg):
            cfg.ppo_mini_batch_size = rows // n  # plan rows are a multiple of n (row_multiple)
        try:
            yield
        finally:
            with open_dict(cfg):
                cfg.ppo_mini_batch_size = original

    def _update_actor(self, batch, metrics: dict):
        with self._planned_minibatch("actor"):
            return super()._update_actor(batch, metrics)

    def _update_critic(self, batch, metrics: dict):
        with self._planned_minibatch("critic"):
            return super()._update_critic(batch, metrics)

    def _advantage_fields(self) -> list[str]:
        fields = ["uid", "response_mask", "old_log_probs", "extra_fields"]
        rollout_cfg = self.config.algorithm.get("rollout_correction", None)
        bypass = bool(rollout_cfg and rollout_cfg.get("bypass_mode", False))
        if not bypass:
            fields.append("entropy")  # written by _compute_old_log_prob (not in bypass mode)
        if self.use_critic:
            fields.append("values")
        if "anchors" in self.agentcredit.needs.step_inputs:
            fields.append("responses")  # a step's anchor state is the response tokens before it
        if self.config.actor_rollout_ref.rollout.calculate_log_probs:
            fields.append("rollout_log_probs")
        if self._teacher_field:
            fields.append(TEACHER_FIELD)
        return fields

    def _compute_advantage(self, batch, metrics: dict):
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=self._advantage_fields()
        )
        nested_mask = data["response_mask"]
        proto = fields_to_dataproto(data)
        # Rejection sampling below zeroes tokens of response_mask; the agent loop's records describe the episode
        # as generated, so the adapter checks them (and assigns credit) on this copy.
        generated_mask = proto.batch["response_mask"].clone()

        # Rollout correction (IS weights / rejection sampling) exactly as verl's own step applies it.
        rollout_cfg = self.config.algorithm.get("rollout_correction", None)
        bypass = bool(rollout_cfg and rollout_cfg.get("bypass_mode", False))
        correct = rollout_cfg is not None and "rollout_log_probs" in proto.batch.keys() and not bypass
        if correct:
            proto, is_metrics = compute_rollout_correction_and_add_to_batch(proto, rollout_cfg)
            metrics.update(is_metrics)

        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]  # rows verl appended to even out
        proto, result = apply_to_dataproto(
            proto,
            self.agentcredit,
            state=self._method_state,
            padding=padding,
            generated_mask=generated_mask,
            rows_per_episode=None if self._plan is None else self._plan.rows_per_episode,
        )
        if result.state is not None:
            self._method_state = result.state
        metrics.update(result.metrics)
        if self._teacher is not None:  # the actor step whose weights scored this batch's potentials
            metrics[teacher_step_metric(self.agentcredit)] = float(self._teacher.weights_step)

        out_fields = ["advantages", "returns"]
        # the losses installed in on_init_end read these
        out_fields += [
            name
            for name, value in ((LOSS_WEIGHTS, result.loss_weights), (VALUE_WEIGHTS, result.value_weights))
            if value is not None
        ]
        if self.agentcredit.tree.strategy != "independent":
            # verl's worker copies the last output's reward_score onto every output of a session, and a tree's
            # leaves are outputs of one session: put each row's own outcome (its record's) where verl's metrics
            # read the score (rm_scores: 0 on every response token but the last, as the worker writes it)
            lengths = [int(row.numel()) for row in nested_mask.unbind(0)]
            scores = torch.zeros(proto.batch["response_mask"].shape, dtype=torch.float32)
            for i, (record, pad) in enumerate(zip(proto.non_tensor_batch[EXTRA_KEY], padding, strict=True)):
                if record is not None and not pad and lengths[i]:
                    scores[i, lengths[i] - 1] = float(record["outcome"])
            proto.batch["rm_scores"] = scores
            out_fields.append("rm_scores")
        if correct:
            out_fields.append("response_mask")
            if "rollout_is_weights" in proto.batch.keys():
                out_fields.append("rollout_is_weights")
        output = TensorDict(
            {name: response_to_nested(proto.batch[name], nested_mask) for name in out_fields},
            batch_size=len(batch),
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)
