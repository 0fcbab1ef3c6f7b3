"""The advantage adapter: verl's batch in, agentcredit's credit functions, per-token advantages out.

verl gives the trainer padded ``[B, T]`` response tensors (``response_mask``, ``old_log_probs``, ``entropy``,
``values``, ``rollout_log_probs``), the prompt ``uid`` of every row, and the agent loop's ``extra_fields``;
this module turns them back into the episodes the credit functions of :mod:`agentcredit.credit` take and
writes their answers onto the tokens. It never re-implements a formula: every number comes from
``grpo_advantages``, ``gae_advantages``, ``segment_advantages``, ``tips_turn_rewards``/``tips_token_rewards``,
``gear_advantages``, ``portool_advantages`` or ``gigpo_advantages``.

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

from agentcredit.credit import (
    critical_action_advantages,
    gae_advantages,
    gear_advantages,
    gigpo_advantages,
    grpo_advantages,
    portool_advantages,
    segment_advantages,
    tips_step_alpha,
    tips_token_rewards,
    tips_turn_rewards,
)
from agentcredit.integrations.verl import EXTRA_KEY
from agentcredit.integrations.verl.fields import RowRecord, Span, parse_records
from agentcredit.integrations.verl.settings import AgentCreditSettings

__all__ = ["AdvantageResult", "Episode", "apply_to_dataproto", "compute_advantages", "group_episodes"]


@dataclass
class AdvantageResult:
    """``advantages`` and ``returns`` are ``[B, T]``, zero off the response mask."""

    advantages: Tensor
    returns: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    alpha: float | None = None  # TIPS: the alpha used for this batch (the trainer keeps it for the next one)


@dataclass
class Episode:
    """The rows of one episode (one row, or one per view in carl-segment's replacement mode)."""

    episode_id: str
    uid: Hashable
    rows: list[int]
    record: RowRecord  # any view's record: the episode-level fields are the same in all of them


def group_episodes(records: Sequence[RowRecord], uids: Sequence[Hashable]) -> list[Episode]:
    """Rows grouped by episode, in first-appearance order; checks that every view is present exactly once."""
    by_id: dict[str, Episode] = {}
    seen_views: dict[str, set[int]] = defaultdict(set)
    for row, (record, uid) in enumerate(zip(records, uids, strict=True)):
        ep = by_id.get(record.episode_id)
        if ep is None:
            ep = by_id[record.episode_id] = Episode(record.episode_id, uid, [], record)
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


def _span_of_segment(records: Sequence[RowRecord], ep: Episode, segment: int) -> tuple[int, Span]:
    for row in ep.rows:
        for span in records[row].spans:
            if span.trained and span.segment == segment:
                return row, span
    raise ValueError(f"episode {ep.episode_id}: policy segment {segment} is not trained in any of its rows")


def _single_view(ep: Episode, method: str) -> int:
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


def _episode_grpo(episodes: list[Episode], settings: AgentCreditSettings, dtype: torch.dtype) -> Tensor:
    outcomes = torch.tensor([ep.record.outcome for ep in episodes], dtype=dtype)
    return grpo_advantages(
        outcomes, [ep.uid for ep in episodes], eps=settings.grpo.eps, scale=settings.grpo.scale
    )


def _last_trained_token(record: RowRecord, row: int) -> int:
    trained = record.trained_spans()
    if not trained:
        raise ValueError(f"row {row} has no policy token to carry the outcome reward")
    return trained[-1].end - 1


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
    previous_alpha: float | None = None,
    rows_per_episode: float | None = None,
) -> AdvantageResult:
    """Per-token advantages and returns of a verl batch for ``settings.method``.

    Args:
        settings: the validated ``agentcredit`` config block.
        response_mask: ``[B, T]`` 1 on policy tokens trained in the row.
        records: one :class:`RowRecord` per row (from ``extra_fields["agentcredit"]``).
        uids: the prompt uid of every row (rows of one prompt form a GRPO group).
        values: ``[B, T]`` critic values, values[t] = V(state before response token t) (ppo, tips, carl-segment).
        old_log_probs, rollout_log_probs, entropy: ``[B, T]`` (gear).
        responses: ``[B, T]`` response token ids (gigpo: a step's anchor state is the prompt, the same in a
            group, plus the response tokens before it; the native trainer's ``anchor_states``).
        previous_alpha: TIPS batch_target mode: alpha to keep when no delta in this batch is non-zero.
        rows_per_episode: rows / trajectories of every verl mini-batch, padding rows included, when the trainer
            laid the batch out in mini-batches of whole episodes (:mod:`.minibatch`); None = this batch's
            average (exact only when the batch is a single mini-batch).
    """
    method = settings.method
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    n_rows = response_mask.shape[0]
    if len(records) != n_rows or len(uids) != n_rows:
        raise ValueError(f"batch has {n_rows} rows but {len(records)} records and {len(uids)} uids")
    _check_rows(records, response_mask)
    mask = response_mask.to(torch.bool)
    dtype = values.dtype if values is not None and values.is_floating_point() else torch.float32
    episodes = group_episodes(records, uids)
    advantages = torch.zeros(response_mask.shape, dtype=dtype)
    metrics: dict[str, float] = {"agentcredit/episodes": float(len(episodes))}
    if not episodes:  # every row was padding
        return AdvantageResult(advantages, advantages.clone(), metrics)

    def need(name: str, tensor: Tensor | None) -> Tensor:
        if tensor is None:
            raise ValueError(f"method {method} needs `{name}` in the batch, and verl did not provide it")
        if tuple(tensor.shape) != tuple(response_mask.shape):
            raise ValueError(
                f"`{name}` has shape {tuple(tensor.shape)}, expected {tuple(response_mask.shape)}"
            )
        return tensor

    if method == "grpo":
        per_episode = _episode_grpo(episodes, settings, dtype).tolist()
        for ep, a in zip(episodes, per_episode, strict=True):
            for row in ep.rows:
                advantages[row] = torch.where(mask[row], a, 0.0)
        return AdvantageResult(advantages, advantages.clone(), metrics)

    if method == "carl-critical":
        # Without the entropy-guided tree (verl samples independent episodes), each prompt's tree is a star:
        # the root with one leaf per episode. critical_action_advantages then gives V(leaf) - V(root) =
        # R - mean(R), and updates every action whose parent has >= 2 children (Eq. 13).
        for ep, a in zip(episodes, _star_tree_advantages(episodes), strict=True):
            for row in ep.rows:
                advantages[row] = torch.where(mask[row], a, 0.0)
        return AdvantageResult(advantages, advantages.clone(), metrics)

    if method == "gear":
        per_episode = _episode_grpo(episodes, settings, dtype)
        g = settings.gear
        student = need(
            "rollout_log_probs" if g.student_logprobs == "rollout" else "old_log_probs",
            rollout_log_probs if g.student_logprobs == "rollout" else old_log_probs,
        )
        ent = need("entropy", entropy)
        for ep, a in zip(episodes, per_episode.tolist(), strict=True):
            for row in ep.rows:
                teacher = records[row].teacher_logprobs
                if teacher is None:
                    raise ValueError(f"row {row}: gear needs teacher_logprobs in extra_fields['{EXTRA_KEY}']")
                teacher_row = torch.zeros(response_mask.shape[1], dtype=student.dtype)
                if len(teacher) > teacher_row.shape[0]:
                    raise ValueError(
                        f"row {row}: {len(teacher)} teacher log-probs for {teacher_row.shape[0]} tokens"
                    )
                teacher_row[: len(teacher)] = torch.tensor(teacher, dtype=student.dtype)
                advantages[row] = gear_advantages(
                    a,
                    student[row],
                    teacher_row,
                    ent[row],
                    mask[row],
                    lambda_kl=g.lambda_kl,
                    lambda_h=g.lambda_h,
                    alpha=g.alpha,
                    beta=g.beta,
                ).to(dtype)
        return AdvantageResult(advantages, advantages.clone(), metrics)

    if method == "gigpo":
        ids = need("responses", responses)
        layout = []  # per episode: (row, its policy spans in order)
        for ep in episodes:
            row = _single_view(ep, method)
            layout.append((row, [span for span in records[row].spans if span.role == "policy"]))
        g = settings.gigpo
        steps = gigpo_advantages(
            [ep.record.outcome for ep in episodes],
            [ep.uid for ep in episodes],
            [[tuple(ids[row, : span.start].tolist()) for span in spans] for row, spans in layout],
            gamma=g.gamma,
            step_weight=g.step_weight,
            eps=settings.grpo.eps,
            scale=g.mode == "mean_std_norm",
        )
        for (row, spans), values in zip(layout, steps, strict=True):
            for span, value in zip(spans, values.tolist(), strict=True):
                advantages[row, span.start : span.end] = value
            advantages[row] = torch.where(mask[row], advantages[row], 0.0)
        return AdvantageResult(advantages, advantages.clone(), metrics)

    if method == "carl-segment":
        v = need("values", values)
        s = settings.carl_segment
        returns = torch.zeros_like(advantages)
        n_eps = len(episodes)
        # verl's seq-mean-token-sum divides a mini-batch's sum by its (padded) row count; this factor makes
        # that a mean over the mini-batch's trajectories, as agentcredit's trainer takes it.
        per_episode = rows_per_episode if rows_per_episode is not None else n_rows / n_eps
        for ep in episodes:
            n_segments = len(ep.record.segment_kinds)
            located = [_span_of_segment(records, ep, k) for k in range(n_segments)]
            boundary_values = [float(v[row, span.start]) for row, span in located]
            seg_adv = segment_advantages(boundary_values, ep.record.outcome, lam=s.lam, gamma=s.gamma)
            for (row, span), a in zip(located, seg_adv, strict=True):
                if s.segment_mean_loss:
                    # Eq. 3 averages tokens within a segment and sums segments; under verl's seq-mean-token-sum
                    # that is a per-token weight 1/|g_k| (PPO's clipped surrogate is positively homogeneous in
                    # A), and rows/episodes turns verl's mean over rows into the paper's mean over episodes.
                    a = a / (span.end - span.start) * per_episode
                advantages[row, span.start : span.end] = a
            for row in ep.rows:
                # Monte-Carlo critic target R at every policy token (carl-segment.md §3.5 regresses V(b_k) on R).
                returns[row] = torch.where(mask[row], float(ep.record.outcome), 0.0)
        metrics["agentcredit/segments_per_episode"] = (
            sum(len(e.record.segment_kinds) for e in episodes) / n_eps
        )
        return AdvantageResult(advantages, returns, metrics)

    if method in ("ppo", "tips"):
        v = need("values", values)
        rewards = torch.zeros_like(advantages)
        alpha = None
        if method == "tips":
            alpha, tips_metrics = _tips_alpha(episodes, settings, previous_alpha)
            metrics.update(tips_metrics)
        for ep in episodes:
            row = _single_view(ep, method)
            record = records[row]
            if method == "ppo":
                rewards[row, _last_trained_token(record, row)] = record.outcome
                continue
            rewards[row] = _tips_row_rewards(record, row, mask[row], settings, alpha, dtype)
        adv, returns = gae_advantages(
            rewards, v.to(dtype), mask, gamma=settings.gae.gamma, lam=settings.gae.lam
        )
        if settings.gae.whiten:
            adv = _whiten(adv, mask.to(adv.dtype))
        return AdvantageResult(adv, returns, metrics, alpha=alpha)

    if method == "portool":
        returns_adv = _portool(episodes, records, mask, settings, dtype)
        return AdvantageResult(returns_adv, returns_adv.clone(), metrics)

    raise ValueError(f"unknown method {method!r}")


def _star_tree_advantages(episodes: list[Episode]) -> list[float]:
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        groups[ep.uid].append(i)
    out = [0.0] * len(episodes)
    for members in groups.values():
        parents = [-1] + [0] * len(members)
        leaf_rewards = {j + 1: episodes[i].record.outcome for j, i in enumerate(members)}
        _, node_adv, update = critical_action_advantages(parents, leaf_rewards)
        for j, i in enumerate(members):
            out[i] = node_adv[j + 1] if update[j + 1] else 0.0
    return out


def _tips_alpha(
    episodes: list[Episode], settings: AgentCreditSettings, previous_alpha: float | None
) -> tuple[float, dict[str, float]]:
    t = settings.tips
    deltas: list[float] = []
    phi0: list[float] = []
    for ep in episodes:
        phi = ep.record.potentials
        if phi is None:
            raise ValueError(
                f"episode {ep.episode_id}: tips needs the teacher potentials in extra_fields['{EXTRA_KEY}'] "
                "(the agent loop computes them when agentcredit.method=tips)"
            )
        phi0.append(phi[0])
        deltas.extend(phi[k] - phi[k - 1] for k in range(1, len(phi)))
    alpha = tips_step_alpha(
        [ep.record.potentials for ep in episodes],
        mode=t.alpha_mode,
        alpha=t.alpha,
        target_mean_abs=t.target_mean_abs,
        previous=previous_alpha,
    )
    metrics = {
        "agentcredit/tips_alpha": float(alpha),
        "agentcredit/tips_phi0_mean": sum(phi0) / len(phi0) if phi0 else 0.0,
        "agentcredit/tips_dphi_abs_mean": sum(abs(d) for d in deltas) / len(deltas) if deltas else 0.0,
    }
    return float(alpha), metrics


def _tips_row_rewards(
    record: RowRecord,
    row: int,
    mask_row: Tensor,
    settings: AgentCreditSettings,
    alpha: float,
    dtype: torch.dtype,
) -> Tensor:
    t = settings.tips
    turn_rewards = tips_turn_rewards(
        record.potentials,
        record.outcome,
        alpha=alpha,
        no_tool_shaping=t.no_tool_shaping,
        terminal_potential=t.terminal_potential,
    )
    ends = {span.segment: span.end - 1 for span in record.trained_spans()}
    # reward k goes on the last policy token of the assistant message that ends turn k (Eq. 17); the final
    # reward (outcome minus the terminal correction) on the last policy token of the response.
    positions = [ends[k] for k in record.tool_turns] + [_last_trained_token(record, row)]
    return tips_token_rewards(turn_rewards, positions, mask_row, dtype=dtype)


def _portool(
    episodes: list[Episode],
    records: Sequence[RowRecord],
    mask: Tensor,
    settings: AgentCreditSettings,
    dtype: torch.dtype,
) -> Tensor:
    """PORTool on the tree verl samples: the prompt's episodes as independent chains under the root.

    Node 0 is the prompt; episode j's policy segments are a chain of step nodes below it, so the root is the
    only fork (verl has no shared-prefix tree rollout; see the docs page).
    """
    p = settings.portool
    out = torch.zeros(mask.shape, dtype=dtype)
    groups: dict[Hashable, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.uid].append(ep)
    for uid, group in groups.items():
        parents, lengths, fmt = [-1], [0], [0.0]
        leaf_of: dict[int, tuple[Episode, list[tuple[int, Span]]]] = {}
        outcomes: dict[int, float] = {}
        for ep in group:
            row = _single_view(ep, "portool")
            record = records[row]
            if len(record.format_rewards) != len(record.segment_kinds) or any(
                r is None for r in record.format_rewards
            ):
                raise ValueError(
                    f"episode {ep.episode_id} (uid {uid!r}): portool needs a formatting reward for every step; "
                    "use the jsoncall protocol"
                )
            steps = [(row, s) for s in record.trained_spans()]
            if len(steps) != len(record.segment_kinds):
                raise ValueError(
                    f"episode {ep.episode_id}: {len(steps)} trained steps for {len(record.segment_kinds)}"
                )
            parent = 0
            for (_, span), r_fm in zip(steps, record.format_rewards, strict=True):
                parents.append(parent)
                lengths.append(span.end - span.start)
                fmt.append(float(r_fm))
                parent = len(parents) - 1
            leaf_of[parent] = (ep, steps)
            outcomes[parent] = record.outcome
        per_leaf = portool_advantages(
            parents, lengths, outcomes, fmt, gamma=p.gamma, w1=p.w1, root_is_fork=p.root_is_fork
        )
        for leaf, step_adv in per_leaf.items():
            _, steps = leaf_of[leaf]
            for (row, span), a in zip(steps, step_adv, strict=True):
                out[row, span.start : span.end] = a
    return out


def apply_to_dataproto(
    data: Any,
    settings: AgentCreditSettings,
    *,
    previous_alpha: float | None = None,
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

    ``rows_per_episode``: see :func:`compute_advantages` (the trainer's mini-batch plan gives it).
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
    real = [row for row, pad in enumerate(padding) if not pad]
    raw = non_tensor.get(EXTRA_KEY)
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
        previous_alpha=previous_alpha,
        rows_per_episode=rows_per_episode,
    )
    kept = trained[index].cpu().to(torch.float32)
    for name, value in (("advantages", result.advantages), ("returns", result.returns)):
        full = torch.zeros(mask.shape, dtype=torch.float32)
        full[index] = value.to(torch.float32) * kept
        batch[name] = full.to(mask.device)
    return data, result
