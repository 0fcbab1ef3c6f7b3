"""agentcredit's losses on verl's workers, where carl-segment needs its own (installed with verl's ``set_loss_fn``).

**Actor.** carl-segment's segment-mean (Eq. 3, carl-segment.md A12: token-mean within a segment, sum over segments, mean over
the trajectories of the mini-batch; "KL and entropy use the same aggregation") is put into verl as a per-token
weight ``w_t = rows / trajectories / |g_k|`` under ``loss_agg_mode=seq-mean-token-sum``. PPO's clipped surrogate is
positively homogeneous in the advantage, so the adapter folds ``w`` into the advantages and verl's own policy
term comes out right. verl's ``ppo_loss`` aggregates the entropy and KL terms on the 0/1 response mask, so they
would still weigh a trajectory by its tokens and rows. :func:`trajectory_weighted_actor_loss` is verl's
``ppo_loss`` with those two terms aggregated on ``entropy * w`` and ``kl * w``; the trainer installs it on the actor
worker with verl's own hook (``set_loss_fn``) when the batch carries :data:`LOSS_WEIGHTS`.

Built from verl's parts (``get_policy_loss_fn``, ``agg_loss``, ``kl_penalty``, ``no_padding_2_padding``), in the
order of verl 0.9.1's ``ppo_loss``; with every weight 1 it equals that function (tested), so a verl release that
changes ``ppo_loss`` shows up there.

**Critic.** :func:`boundary_value_loss`: carl-segment's critic objective (sigmoid value, Monte-Carlo MSE at the
segment boundaries only, no clipping) on verl's critic model, in place of verl's clipped per-token value loss.
"""

from __future__ import annotations

from typing import Any

import torch

#: The per-token loss-weight field the advantage step writes (nested like ``advantages``).
LOSS_WEIGHTS = "agentcredit_loss_weights"
#: carl-segment's critic: each boundary's weight in the value loss, 0 elsewhere (nested like ``returns``).
VALUE_WEIGHTS = "agentcredit_value_weights"


def trajectory_weighted_actor_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None):
    """verl's PPO loss (policy term, entropy bonus, KL loss) with entropy and KL weighted by :data:`LOSS_WEIGHTS`.

    Same signature and metrics as ``verl.workers.utils.losses.ppo_loss``; the weights must be present.
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    if LOSS_WEIGHTS not in data.keys():
        raise ValueError(
            f"trajectory_weighted_actor_loss: the batch has no '{LOSS_WEIGHTS}' field (the agentcredit trainer's "
            "advantage step writes it when the method's segment_mean_loss is on)"
        )
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    info = config.global_batch_info  # as verl's ppo_loss: the global batch sizes the aggregation divides by
    info["dp_size"] = data["dp_size"]
    info["batch_num_tokens"] = data["batch_num_tokens"]
    info["global_batch_size"] = data["global_batch_size"]
    info["loss_scale_factor"] = config.loss_scale_factor
    aggregation = _metric_aggregation(config, data)
    fields = ["response_mask", "old_log_probs", "advantages", LOSS_WEIGHTS]
    fields += [name for name in ("rollout_is_weights", "ref_log_prob") if name in data.keys()]
    data = data.select(*fields).to_padded_tensor()
    mask = data["response_mask"].to(bool)
    weights = data[LOSS_WEIGHTS].to(log_prob.dtype)
    mode = config.loss_agg_mode

    policy_loss_fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=data["old_log_probs"],
        log_prob=log_prob,
        advantages=data["advantages"],
        response_mask=mask,
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=data.get("rollout_is_weights", None),
    )
    metrics = dict(Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN))
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=aggregation)
    loss = pg_loss
    if entropy is not None:
        entropy_loss = agg_loss(loss_mat=entropy * weights, loss_mask=mask, loss_agg_mode=mode, **info)
        loss = loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=aggregation)
    if config.use_kl_loss:
        kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld * weights, loss_mask=mask, loss_agg_mode=mode, **info)
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=aggregation)
        metrics["kl_coef"] = config.kl_loss_coef
    return loss, metrics


def boundary_value_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None):
    """carl-segment's critic loss on verl's critic model: ``0.5 (sigmoid(v) - R)^2`` at the segment boundaries.

    §3.4-3.5 and A12 / A15: V = sigmoid(head) in [0, 1], regressed on the Monte-Carlo target R at every boundary
    s_k (the first token of each policy segment, transient states included), mean over a trajectory's boundaries,
    then over the mini-batch's trajectories, no value clipping. :data:`VALUE_WEIGHTS` holds ``rows/episodes /
    boundaries`` at the boundaries, so verl's ``seq-mean-token-sum`` (sum over the mini-batch / its rows) gives
    exactly those means (the same construction as the actor's weights). The 0.5 is the paper's c_v, as in
    agentcredit's trainer (``train.losses.token_value_loss``). Replaces verl's ``value_loss`` (clipped, every
    token); the trainer installs it with ``set_loss_fn`` for carl-segment.
    """
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.metric import Metric
    from verl.workers.utils.padding import no_padding_2_padding

    if VALUE_WEIGHTS not in data.keys():
        raise ValueError(
            f"boundary_value_loss: the batch has no '{VALUE_WEIGHTS}' field (the agentcredit trainer's advantage "
            "step writes it for a method with a boundary critic)"
        )
    vpreds = no_padding_2_padding(model_output["values"], data)
    dp_size, global_batch_size = data["dp_size"], data["global_batch_size"]
    aggregation = _metric_aggregation(config, data)
    data = data.select("returns", "response_mask", VALUE_WEIGHTS).to_padded_tensor()
    mask = data["response_mask"].to(bool)
    weights = data[VALUE_WEIGHTS].to(vpreds.dtype)
    values = torch.sigmoid(vpreds)
    per_token = 0.5 * (values - data["returns"].to(vpreds.dtype)) ** 2 * weights
    loss = agg_loss(
        loss_mat=per_token,
        loss_mask=mask,
        loss_agg_mode="seq-mean-token-sum",
        dp_size=dp_size,
        global_batch_size=global_batch_size,
    )
    # V and its explained variance at the boundaries are logged by the advantage step (agentcredit/boundary_*)
    return loss, {"critic/vf_loss": Metric(value=loss, aggregation=aggregation)}


def _metric_aggregation(config: Any, data: Any):
    """How verl merges a loss metric over micro-batches, by its own rule (``ppo_loss`` / ``value_loss``): a sum
    when the loss is already normalised over the global mini-batch, else a mean."""
    from verl.utils.metric import AggregationType

    global_norm = (
        data["dp_size"] > 1
        or data["batch_num_tokens"] is not None
        or data["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    )
    return AggregationType.SUM if global_norm else AggregationType.MEAN
