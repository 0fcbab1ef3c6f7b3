"""The advantage adapter: verl's batch in, agentcredit's credit functions, per-token advantages out.

verl gives the trainer padded ``[B, T]`` response tensors (``response_mask``, ``old_log_probs``, ``entropy``,
``values``, ``rollout_log_probs``), the prompt ``uid`` of every row, and the agent loop's ``extra_fields``;
this module lays them out as the neutral episodes of :mod:`agentcredit.credit.estimators` and calls the
same shaping, estimator and reweighting entries as the native trainer, so a method is defined once for both.
verl samples episodes independently, so carl-critical and PORTool see each prompt's episodes as chains under
the prompt (:func:`~agentcredit.credit.estimators.chain_trees`): the prompt is the only fork.

:func:`compute_advantages` is the pure core (tensors and records in, tensors out);
:func:`apply_to_dataproto` is the thin wrapper over verl's ``DataProto`` that the trainer calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentcredit.credit import Episode, EpisodeBatch, Method, Step, chain_trees, get_method
from agentcredit.integrations.verl import EXTRA_KEY
from agentcredit.integrations.verl.fields import TEACHER_FIELD, RowRecord, Span, parse_records
from agentcredit.integrations.verl.losses import LOSS_WEIGHTS, VALUE_WEIGHTS
from agentcredit.integrations.verl.settings import AgentCreditSettings

__all__ = ["AdvantageResult", "EpisodeRows", "apply_to_dataproto", "compute_advantages", "group_episodes"]


@dataclass
class AdvantageResult:
    """``advantages`` and ``returns`` are ``[B, T]``, zero off the response mask."""

    advantages: Tensor
    returns: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    # the method's state after this batch (Method.batch_signals: TIPS's alpha), which the trainer hands to the
    # next batch and saves with its checkpoints; None when no part of the method keeps one
    state: dict[str, Any] | None = None
    # segment_mean_loss (Method.token_weights): each token's weight in the loss (folded into ``advantages`` already;
    # the actor's entropy and KL terms read it, agentcredit.integrations.verl.losses); None = every token weighs 1
    loss_weights: Tensor | None = None
    # a boundary critic's weights in the critic's loss (Method.token_weights: mean over a trajectory's boundaries,
    # then over the trajectories; agentcredit.integrations.verl.losses.boundary_value_loss); None = verl's value loss
    value_weights: Tensor | None = None


@dataclass
class EpisodeRows:
    """The rows of one episode in verl's batch (one row, or one per view in carl-segment's replacement mode): what
    the adapter reads to lay the episode out as the credit layer's :class:`~agentcredit.credit.Episode`."""

    episode_id: str
    uid: Hashable
    rows: list[int]
    record: RowRecord  # any view's record: the episode-level fields are the same in all of them


def group_episodes(records: Sequence[RowRecord], uids: Sequence[Hashable]) -> list[EpisodeRows]:
    """Rows grouped by episode, in first-appearance order; checks that every view is present exactly once."""
    by_id: dict[str, EpisodeRows] = {}
    seen_views: dict[str, set[int]] = defaultdict(set)
    for row, (record, uid) in enumerate(zip(records, uids, strict=True)):
        ep = by_id.get(record.episode_id)
        if ep is None:
            ep = by_id[record.episode_id] = EpisodeRows(record.episode_id, uid, [], record)
        elif ep.uid != uid:
            raise ValueError(
                f"rows of episode {record.episode_id} carry different uids ({ep.uid!r} and {uid!r})"
            )
        if record.view in seen_views[record.episode_id]:
            raise ValueError(f"episode {record.episode_id} has view {record.view} twice (row {row})")
        seen_views[record.episode_id].add(record.view)
        ep.rows.append(row)
    for ep in by_id.values():
        if len(ep.rows) != ep.record.n_views:
            raise ValueError(
                f"episode {ep.episode_id} has {len(ep.rows)} of its {ep.record.n_views} rows in this batch; "
                "all views of an episode must be trained together"
            )
        ep.rows.sort(key=lambda r: records[r].view)
    return list(by_id.values())


def _check_rows(records: Sequence[RowRecord], mask: Tensor) -> None:
    """Every trained span lies on response_mask == 1 and inside the row; nothing else is on the mask."""
    length = mask.shape[1]
    for row, record in enumerate(records):
        expected = torch.zeros(length, dtype=torch.bool)
        for i, span in enumerate(record.spans):
            if span.end > length:
                raise ValueError(
                    f"row {row}: spans[{i}] ends at {span.end} beyond the response length {length} "
                    "(was the response truncated after the agent loop recorded it?)"
                )
            if span.trained:
                expected[span.start : span.end] = True
        actual = mask[row].to(torch.bool).cpu()
        if not torch.equal(expected, actual):
            bad = int((expected != actual).nonzero()[0])
            raise ValueError(
                f"row {row}: response_mask[{bad}] = {int(actual[bad])} but the agentcredit record says "
                f"{int(expected[bad])}; the record and verl's response_mask disagree"
            )


def _span_of_segment(records: Sequence[RowRecord], ep: EpisodeRows, segment: int) -> tuple[int, Span]:
    for row in ep.rows:
        for span in records[row].spans:
            if span.trained and span.segment == segment:
                return row, span
    raise ValueError(f"episode {ep.episode_id}: policy segment {segment} is not trained in any of its rows")


def _single_view(ep: EpisodeRows, method: str) -> int:
    if len(ep.rows) != 1:
        raise ValueError(
            f"{method} needs one row per episode, but episode {ep.episode_id} was split into {len(ep.rows)} views "
            "(transient tool outputs); use the protocol's append mode with this method"
        )
    return ep.rows[0]


def _whiten(advantages: Tensor, mask: Tensor) -> Tensor:
    # verl's own masked whitening, so the PPO paths match verl's GAE estimator exactly.
    from verl.utils.torch_functional import masked_whiten

    return masked_whiten(advantages, mask) * mask


def _episode_batch(
    method: Method,
    episodes: list[EpisodeRows],
    records: Sequence[RowRecord],
    *,
    shape: tuple[int, int],
    dtype: torch.dtype,
    responses: Tensor | None,
) -> EpisodeBatch:
    """verl's episodes in the neutral layout: steps are the policy segments where their view trains them; the
    episodes of one rollout tree share its nodes, and independent ones are chains under the prompt
    (:func:`chain_trees`)."""
    needs = method.all_needs
    out = []
    for ep in episodes:
        record = ep.record
        if "anchors" in needs.step_inputs:
            # a step's anchor: the prompt (the same in a group) plus the response tokens before it, one view only
            _single_view(ep, method.name)
        if "format_reward" in needs.step_inputs and (
            len(record.format_rewards) != len(record.segment_kinds)
            or any(r is None for r in record.format_rewards)
        ):
            raise ValueError(
                f"episode {ep.episode_id} (uid {ep.uid!r}): {method.name} needs a formatting reward for every "
                "step; use the jsoncall protocol"
            )
        steps = []
        for k in range(len(record.segment_kinds)):
            row, span = _span_of_segment(records, ep, k)
            steps.append(
                Step(
                    row,
                    span.start,
                    span.end,
                    anchor=tuple(responses[row, : span.start].tolist()) if responses is not None else (),
                    format_reward=float(record.format_rewards[k] or 0.0) if record.format_rewards else 0.0,
                    env_reward=record.env_rewards[k] if record.env_rewards else 0.0,
                )
            )
        if "potentials" in needs.signals and record.potentials is None:
            raise ValueError(
                f"episode {ep.episode_id}: {method.name} needs the teacher potentials in extra_fields['{EXTRA_KEY}'] "
                f"(the agent loop computes them when agentcredit.method={method.name})"
            )
        out.append(Episode(ep.uid, record.outcome, tuple(steps), tuple(record.tool_turns)))
    trees = {}
    if "tree" in needs.step_inputs:  # a tree rollout's episodes share the steps they share; else chains
        keys = [
            [(ep.record.tree_id, n) for n in ep.record.step_nodes] if ep.record.tree_id else None
            for ep in episodes
        ]
        forks: dict[Hashable, dict[Hashable, int]] = {}
        seen_trees = set()
        for ep in episodes:  # every record of a tree carries its fork counts: count each tree once
            r = ep.record
            if r.tree_id and r.fork_counts and r.tree_id not in seen_trees:
                seen_trees.add(r.tree_id)
                group = forks.setdefault(ep.uid, {})
                for node, c in r.fork_counts.items():
                    key = None if node == 0 else (r.tree_id, node)
                    group[key] = group.get(key, 0) + c
        out, trees = chain_trees(out, keys, forks or None)
    signals: dict[str, Any] = {}
    if "potentials" in needs.signals:
        signals["potentials"] = [tuple(ep.record.potentials) for ep in episodes]
    # the signals a user's scorer computed on the workers (agentcredit.integrations.verl.signals), one per episode
    for name in sorted(needs.signals & {n for ep in episodes for n in ep.record.signals}):
        missing = [ep.episode_id for ep in episodes if name not in ep.record.signals]
        if missing:
            raise ValueError(
                f"episode {missing[0]}: {method.name} needs the signal {name!r} in extra_fields['{EXTRA_KEY}'], "
                "which its scorer computed for other episodes of the batch only"
            )
        signals[name] = [ep.record.signals[name] for ep in episodes]
    return EpisodeBatch(shape=shape, episodes=out, trees=trees, signals=signals, dtype=dtype)


def compute_advantages(
    settings: AgentCreditSettings,
    *,
    response_mask: Tensor,
    records: Sequence[RowRecord],
    uids: Sequence[Hashable],
    values: Tensor | None = None,
    old_log_probs: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
    entropy: Tensor | None = None,
    responses: Tensor | None = None,
    state: dict[str, Any] | None = None,
    rows_per_episode: float | None = None,
    teacher_logprobs: Tensor | None = None,
) -> AdvantageResult:
    """Per-token advantages and returns of a verl batch for ``settings.method``.

    The method is ``METHODS[settings.method]`` (:mod:`agentcredit.credit.methods`), and this calls its one entry
    ``advantages(layout, settings)`` as the native trainer does; this function lays verl's rows out for it, fills
    the signals its needs name, and then does what is verl's own: masked whitening for GAE, and (carl-segment)
    the critic's targets and weights on every response token and the segment-mean as a per-token weight.

    Args:
        settings: the validated ``agentcredit`` config block.
        response_mask: ``[B, T]`` 1 on policy tokens trained in the row.
        records: one :class:`RowRecord` per row (from ``extra_fields["agentcredit"]``).
        uids: the prompt uid of every row (rows of one prompt form a GRPO group).
        values: ``[B, T]`` critic values, values[t] = V(state before response token t) (ppo, tips, carl-segment).
        old_log_probs, rollout_log_probs, entropy: ``[B, T]`` (gear).
        responses: ``[B, T]`` response token ids (step input ``anchors``: a step's anchor state is the prompt, the same in a
            group, plus the response tokens before it; the native trainer's ``anchor_states``).
        state: the method's state from the previous batch (:attr:`AdvantageResult.state`; TIPS's batch_target
            alpha, kept when no delta in this batch is non-zero); None = the start of training.
        rows_per_episode: rows / trajectories of every verl mini-batch, padding rows included, when the trainer
            laid the batch out in mini-batches of whole episodes (:mod:`.minibatch`); None = this batch's
            average (exact only when the batch is a single mini-batch).
        teacher_logprobs: ``[B, T']`` GEAR's teacher log-probs per response token (the trainer's tensor field);
            None = read them from the records.
    """
    method = get_method(settings.method)
    needs = method.all_needs
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    n_rows = response_mask.shape[0]
    if len(records) != n_rows or len(uids) != n_rows:
        raise ValueError(f"batch has {n_rows} rows but {len(records)} records and {len(uids)} uids")
    _check_rows(records, response_mask)
    mask = response_mask.to(torch.bool)
    dtype = values.dtype if values is not None and values.is_floating_point() else torch.float32
    episodes = group_episodes(records, uids)
    metrics: dict[str, float] = {"agentcredit/episodes": float(len(episodes))}
    if not episodes:  # every row was padding
        zeros = torch.zeros(response_mask.shape, dtype=dtype)
        return AdvantageResult(zeros, zeros.clone(), metrics)

    def need(name: str, tensor: Tensor | None) -> Tensor:
        if tensor is None:
            raise ValueError(f"method {method.name} needs `{name}` in the batch, and verl did not provide it")
        if tuple(tensor.shape) != tuple(response_mask.shape):
            raise ValueError(
                f"`{name}` has shape {tuple(tensor.shape)}, expected {tuple(response_mask.shape)}"
            )
        return tensor

    layout = _episode_batch(
        method,
        episodes,
        records,
        shape=tuple(response_mask.shape),
        dtype=dtype,
        responses=need("responses", responses) if "anchors" in needs.step_inputs else None,
    )
    parts = method.settings_from(settings)
    if "values" in needs.signals:
        layout.signals["values"] = need("values", values)
        if method.estimating.critic_values is not None:
            # verl's critic model outputs the head's value, which the trainer's boundary loss
            # (losses.boundary_value_loss) trains through the same V as the method reads
            layout.signals["values"] = method.estimating.critic_values(layout.signals["values"])
    new_state = None
    for part in method.parts:  # per-batch signals with a state carried between batches (TIPS's alpha)
        if part.batch_signals is not None:
            new_state = dict(state or {}) if new_state is None else new_state
            signals, carried, stats = part.batch_signals(layout, parts[part.section], new_state)
            layout.signals.update(signals)
            new_state.update(carried)
            metrics.update({f"agentcredit/{k}": v for k, v in stats.items()})
    if "teacher_logp" in needs.signals:
        rollout = _settings_needing(method, parts, "teacher_logp").student_logprobs == "rollout"
        student = need(
            "rollout_log_probs" if rollout else "old_log_probs",
            rollout_log_probs if rollout else old_log_probs,
        )
        layout.signals["student_logp"] = student
        layout.signals["entropy"] = need("entropy", entropy)
        if teacher_logprobs is not None:  # the trainer's tensor field (TEACHER_FIELD)
            teacher = _fit_width(teacher_logprobs, response_mask.shape[1]).to(student.dtype)
        else:  # the records' lists (a batch the trainer did not lay out)
            teacher = _teacher_logprobs(
                records, response_mask.shape, student.dtype, _part_needing(method, "teacher_logp").name
            )
        layout.signals["teacher_logp"] = teacher
    estimate = method.advantages(layout, parts)
    metrics.update({f"agentcredit/{k.replace('/', '_')}": v for k, v in estimate.stats.items()})
    # verl trains every token of the response mask: an action outside the update set (carl-critical) gets 0
    advantages = torch.where(estimate.loss_mask, estimate.advantages.to(dtype), 0.0)
    loss_weights = value_weights = None
    returns = estimate.returns if estimate.returns is not None else advantages.clone()

    if method.estimating.token_weights is not None:
        # verl's seq-mean-token-sum divides a mini-batch's sum by its rows: rows/episodes makes that a mean over the
        # mini-batch's episodes (its episodes are whole: the trainer's mini-batch plan)
        per_episode = rows_per_episode if rows_per_episode is not None else n_rows / len(episodes)
        critic = method.estimating.token_weights(layout, per_episode)
        returns, value_weights = (
            critic.returns.to(advantages.dtype),
            critic.value_weights.to(advantages.dtype),
        )
        metrics.update({f"agentcredit/{k}": v for k, v in critic.stats.items()})
        if getattr(parts[method.estimating.section], "segment_mean_loss", False):
            # the same weights go to the entropy and KL terms (A12) through the trainer's actor loss
            loss_weights = critic.loss_weights.to(advantages.dtype)
            advantages = advantages * loss_weights
    if getattr(parts[method.estimating.section], "whiten", False):  # verl's GAE section
        advantages = _whiten(advantages, mask.to(advantages.dtype))
    return AdvantageResult(
        advantages, returns, metrics, state=new_state, loss_weights=loss_weights, value_weights=value_weights
    )


def _part_needing(method: Method, signal: str) -> Method:
    """The part of ``method`` that needs ``signal`` (the teacher's log-probs: GEAR)."""
    return next(p for p in method.parts if signal in p.needs.signals)


def _settings_needing(method: Method, parts: dict[str, Any], signal: str) -> Any:
    """The settings of the part of ``method`` that needs ``signal``."""
    return parts[_part_needing(method, signal).section]


def _fit_width(values: Tensor, width: int) -> Tensor:
    """``values`` [B, T'] cut or zero-padded to [B, width] (a padded nested field's width is its own longest row)."""
    if values.dim() != 2:
        raise ValueError(f"teacher log-probs must be [B, T], got shape {tuple(values.shape)}")
    if values.shape[1] >= width:
        return values[:, :width]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _teacher_logprobs(
    records: Sequence[RowRecord], shape: torch.Size, dtype: torch.dtype, method: str
) -> Tensor:
    out = torch.zeros(tuple(shape), dtype=dtype)
    for row, record in enumerate(records):
        teacher = record.teacher_logprobs
        if teacher is None:
            raise ValueError(f"row {row}: {method} needs teacher_logprobs in extra_fields['{EXTRA_KEY}']")
        if len(teacher) > shape[1]:
            raise ValueError(f"row {row}: {len(teacher)} teacher log-probs for {shape[1]} tokens")
        out[row, : len(teacher)] = torch.tensor(teacher, dtype=dtype)
    return out


def teacher_call_metrics(records: Sequence[RowRecord]) -> dict[str, float]:
    """The batch's teacher scoring calls (TIPS, GEAR): ``agentcredit/teacher_requests`` sent and
    ``agentcredit/teacher_resent_frac``, the share of them that vLLM's prefix cache answered too far into the scored
    tokens, so they were sent again whole (:mod:`.scoring`). Empty when no record counted a call (no teacher)."""
    calls = [r.teacher_calls for r in records if r.teacher_calls]
    if not calls:
        return {}
    requests = sum(c.get("requests", 0) for c in calls)
    resent = sum(c.get("resent", 0) for c in calls)
    return {
        "agentcredit/teacher_requests": float(requests),
        "agentcredit/teacher_resent_frac": resent / requests if requests else 0.0,
    }


def apply_to_dataproto(
    data: Any,
    settings: AgentCreditSettings,
    *,
    state: dict[str, Any] | None = None,
    padding: Sequence[bool] | None = None,
    generated_mask: Tensor | None = None,
    rows_per_episode: float | None = None,
) -> tuple[Any, AdvantageResult]:
    """Compute advantages for a verl ``DataProto`` and store them as ``advantages`` / ``returns``.

    Reads ``response_mask`` and, when present, ``values``, ``old_log_probs``, ``rollout_log_probs`` and
    ``entropy`` from ``data.batch``; ``uid`` and ``agentcredit`` (the agent loop's extra field) from
    ``data.non_tensor_batch``. ``padding`` flags the synthetic rows verl appends to make the batch divisible
    (tag ``is_padding``: a copy of a real row's metadata with an empty response mask); they get zeros.

    ``generated_mask`` is ``response_mask`` as the agent loop generated it, when verl's rollout correction has
    since removed tokens from ``response_mask`` (rejection sampling). The records describe the generated
    episode, so they are checked against it and the credit is computed on it; advantages and returns are then
    zeroed wherever ``response_mask`` no longer trains a token.

    ``state`` and ``rows_per_episode``: see :func:`compute_advantages` (the trainer keeps the one, its mini-batch
    plan gives the other).
    """
    batch, non_tensor = data.batch, data.non_tensor_batch
    trained = batch["response_mask"]
    mask = trained if generated_mask is None else generated_mask.to(trained.device)
    if tuple(mask.shape) != tuple(trained.shape):
        raise ValueError(
            f"generated_mask has shape {tuple(mask.shape)}, response_mask {tuple(trained.shape)}"
        )
    if bool((trained.bool() & ~mask.bool()).any()):
        raise ValueError("response_mask trains tokens the generated mask does not; it may only remove tokens")
    n_rows = mask.shape[0]
    if "uid" not in non_tensor:
        raise ValueError("the batch has no `uid`: rows of one prompt cannot be grouped")
    padding = [False] * n_rows if padding is None else [bool(p) for p in padding]
    if len(padding) != n_rows:
        raise ValueError(f"padding has {len(padding)} flags for a batch of {n_rows} rows")
    for row, pad in enumerate(padding):
        if pad and bool(mask[row].any()):
            raise ValueError(f"row {row} is flagged as padding but has trained tokens in its response_mask")
    raw = non_tensor.get(EXTRA_KEY)
    # episodes in which a tool could not run (the agent loop marked and masked them): left out like padding
    failed = {
        row: raw[row]["episode_id"]
        for row, pad in enumerate(padding)
        if not pad and raw is not None and isinstance(raw[row], dict) and raw[row].get("infra_failures")
    }
    for row in failed:
        if bool(mask[row].any()):
            raise ValueError(f"row {row} records an infrastructure failure but has trained tokens")
    real = [row for row, pad in enumerate(padding) if not pad and row not in failed]
    records = parse_records(None if raw is None else [raw[r] for r in real], len(real))
    index = torch.tensor(real, dtype=torch.long)

    def optional(name: str) -> Tensor | None:
        return batch[name][index].cpu() if name in batch.keys() else None

    result = compute_advantages(
        settings,
        response_mask=mask[index].cpu(),
        records=records,
        uids=[non_tensor["uid"][r] for r in real],
        values=optional("values"),
        old_log_probs=optional("old_log_probs"),
        rollout_log_probs=optional("rollout_log_probs"),
        entropy=optional("entropy"),
        responses=optional("responses"),
        state=state,
        rows_per_episode=rows_per_episode,
        teacher_logprobs=optional(TEACHER_FIELD),
    )
    result.metrics["agentcredit/infra_failed_episodes"] = float(len(set(failed.values())))
    result.metrics.update(teacher_call_metrics(records))
    kept = trained[index].cpu().to(torch.float32)
    stored = [("advantages", result.advantages), ("returns", result.returns)]
    if result.loss_weights is not None:
        stored.append((LOSS_WEIGHTS, result.loss_weights))
    if result.value_weights is not None:
        stored.append((VALUE_WEIGHTS, result.value_weights))
    for name, value in stored:
        full = torch.zeros(mask.shape, dtype=torch.float32)
        full[index] = value.to(torch.float32) * kept
        batch[name] = full.to(mask.device)
    return data, result
