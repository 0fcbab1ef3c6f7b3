"""The PPO clipped surrogate every method trains with, and its three aggregations.

Per policy token (Schulman et al. 2017, Eq. 7; carl-segment Eq. 3, carl-critical Eqs. 2-3, PORTool Eq. 1,
GEAR Eq. 6, TIPS Eq. 1)::

    r_t    = exp(logp_t - old_logp_t)
    loss_t = -min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)

aggregated over the tokens with ``mask == 1``:

* ``"token-mean"``: the mean over all policy tokens of the batch (carl-critical Eq. 2, 1/|D|; TIPS/verl's
  default).
* ``"seq-mean-token-mean"``: the mean over each row's tokens, then the mean over the rows that have tokens
  (PORTool Eq. 1, which Theorem 3.1 requires; GRPO and GEAR Eqs. 1/6).
* ``"segment-mean"``: the mean over each segment's tokens (``segment_ids``), summed over the segments of a
  row, then the mean over the rows that have tokens (carl-segment Eq. 3 with the total loss
  -sum_k L_k^CLIP, Sec. 3.4): every segment weighs the same whatever its length.

:func:`split_policy_loss` is PORTool's split min (App. B): the advantage is a sum of terms (trajectory and fork)
and each gets its own clipped min, ``-sum_i min(r A_i, clip(r) A_i)``, aggregated with the same weights. It equals
the single min on ``sum_i A_i`` unless a token's ratio is clipped while its terms have opposite signs.

Optional ``dual_clip`` is verl's dual-clip constant c (Ye et al. 2020; 3.0 in verl and the TIPS runs): for
A < 0 the token loss is capped at -c * A. The default None is the plain clipped surrogate of the papers.

:func:`policy_loss_stats` gives the diagnostics a trainer logs (clip fraction, approximate KL, ratio range) from
the same inputs without changing the loss's contract.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from agentcredit.credit._validate import as_mask, choice, finite_float, finite_where, float_tensor, same_shape

__all__ = [
    "policy_loss",
    "split_policy_loss",
    "policy_loss_stats",
    "aggregation_weights",
    "LOSS_AGGREGATIONS",
]

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "segment-mean"]
LOSS_AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "segment-mean")


def _checked(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float
) -> tuple[Tensor, float]:
    for name, t in (("logp", logp), ("old_logp", old_logp), ("advantages", advantages)):
        float_tensor(t, name)
    shape = same_shape({"logp": logp, "old_logp": old_logp, "advantages": advantages}, ndim=2)
    keep = as_mask(mask, "mask", shape)
    clip_eps = finite_float(clip_eps, "clip_eps")
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps}")
    for name, t in (("logp", logp), ("old_logp", old_logp), ("advantages", advantages)):
        finite_where(t.detach(), name, keep)
    return keep, clip_eps


def _token_terms(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, keep: Tensor, clip_eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ratio, unclipped loss, clipped loss, advantages), with ratio = 1 and A = 0 off the mask.

    Off-mask positions are replaced *before* exp so that padding garbage can neither overflow nor send a NaN
    gradient through ``torch.where`` (whose backward multiplies the unused branch's gradient by zero).
    """
    log_ratio = torch.where(
        keep, logp - old_logp.detach(), torch.zeros((), dtype=logp.dtype, device=logp.device)
    )
    ratio = torch.exp(log_ratio)
    adv = torch.where(
        keep, advantages.detach(), torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    )
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return ratio, unclipped, clipped, adv


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    agg: LossAggregation = "token-mean",
    segment_ids: Tensor | None = None,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """The PPO clipped policy loss to minimise (a scalar).

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the current policy (carries the gradient).
        old_logp: ``[B, T]`` log-probs under the behaviour policy (treated as constant).
        advantages: ``[B, T]`` per-token advantages (treated as constant).
        mask: ``[B, T]`` bool or 0/1; 1 on the policy tokens to train.
        clip_eps: the clip range epsilon (0.2 in every paper that states it; PORTool/carl-critical: spec default).
        agg: ``"token-mean"`` (default: verl's default and carl-critical's Eq. 2), ``"seq-mean-token-mean"``
            (PORTool Eq. 1, GRPO, GEAR) or ``"segment-mean"`` (carl-segment Eq. 3); see the module docstring.
        segment_ids: ``[B, T]`` integer segment label per token, required by ``"segment-mean"`` only; tokens of
            one row with the same label form one segment.
        dual_clip: verl's dual-clip constant c (> 1), or None (default, plain PPO).
        weights: per-token weights from :func:`aggregation_weights` computed over a larger batch (a minibatch
            split into microbatches); when given they replace ``agg``.

    Returns:
        A 0-d tensor in the dtype of ``logp``; 0 (still attached to ``logp``) when the mask is empty.
    """
    keep, clip_eps = _checked(logp, old_logp, advantages, mask, clip_eps)
    choice(agg, "agg", LOSS_AGGREGATIONS)
    if agg != "segment-mean" and segment_ids is not None:
        raise ValueError(f'segment_ids is only used by agg="segment-mean", not agg={agg!r}')
    if dual_clip is not None:
        dual_clip = finite_float(dual_clip, "dual_clip")
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (verl uses 3.0), got {dual_clip}")

    if weights is None:
        weights = aggregation_weights(keep, agg, segment_ids=segment_ids)
    elif not isinstance(weights, Tensor) or weights.shape != keep.shape:
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must be a tensor of shape {tuple(keep.shape)}, got {shape}")

    _, unclipped, clipped, adv = _token_terms(logp, old_logp, advantages, keep, clip_eps)
    per_token = torch.maximum(unclipped, clipped)  # -min(rA, clip(r)A)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    per_token = torch.where(keep, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    return (per_token * weights.to(per_token.dtype)).sum()


def split_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    parts: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    agg: LossAggregation = "token-mean",
    segment_ids: Tensor | None = None,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """The clipped loss of an advantage given as terms, each in its own min (PORTool App. B, portool.txt
    l. 1034-1044: f = f_trj + f_fork, "we do not replace A by a single sum inside one min(.)", l. 1142-1143).

    ``parts`` is ``[B, T, K]``: K advantage terms per token whose sum is the advantage. Every other argument is
    :func:`policy_loss`'s; the result is the sum of K :func:`policy_loss` calls (the aggregation is linear).
    """
    if not isinstance(parts, Tensor) or parts.dim() != 3 or parts.shape[-1] < 1:
        shape = tuple(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
        raise ValueError(f"parts must be a [B, T, K] tensor of advantage terms, got {shape}")
    kw = {"clip_eps": clip_eps, "agg": agg, "segment_ids": segment_ids, "dual_clip": dual_clip}
    return sum(
        (
            policy_loss(logp, old_logp, parts[..., k], mask, weights=weights, **kw)
            for k in range(parts.shape[-1])
        ),
        start=torch.zeros((), dtype=logp.dtype, device=logp.device),
    )


def aggregation_weights(
    mask: Tensor,
    agg: LossAggregation = "token-mean",
    *,
    segment_ids: Tensor | None = None,
    sequence_ids: Tensor | None = None,
) -> Tensor:
    """Per-token weights w with ``policy_loss(..., agg) == sum_t w_t * loss_t`` (0 off the mask).

    The three aggregations are weighted sums: token-mean w = 1/|tokens|; seq-mean-token-mean
    w = 1/(|sequences| * |tokens of the sequence|); segment-mean w = 1/(|sequences| * |tokens of the segment|).
    Computing the weights once over a whole minibatch and summing ``w * loss`` over its microbatches gives exactly
    the minibatch loss, whatever the microbatch split.

    ``sequence_ids`` (``[B]`` integers, default: each row its own sequence) groups rows into one sequence, for a
    trajectory stored as several rows (carl-segment's replacement mode, where each row is one exact context).
    Segments are identified by ``(sequence, segment_id)``.
    """
    choice(agg, "agg", LOSS_AGGREGATIONS)
    keep = mask.bool()
    if keep.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(keep.shape)}")
    if sequence_ids is None:
        seq = torch.arange(keep.shape[0], device=keep.device)
    else:
        if not isinstance(sequence_ids, Tensor) or sequence_ids.shape != keep.shape[:1]:
            raise ValueError(f"sequence_ids must be a [B] = [{keep.shape[0]}] integer tensor")
        if sequence_ids.is_floating_point() or sequence_ids.dtype == torch.bool:
            raise ValueError(f"sequence_ids must be an integer tensor, got dtype {sequence_ids.dtype}")
        seq = sequence_ids.to(keep.device).long()
    if agg == "segment-mean":
        if segment_ids is None:
            raise ValueError('agg="segment-mean" needs segment_ids [B, T]')
        if not isinstance(segment_ids, Tensor) or segment_ids.shape != keep.shape:
            shape = (
                tuple(segment_ids.shape) if isinstance(segment_ids, Tensor) else type(segment_ids).__name__
            )
            raise ValueError(f"segment_ids must be a tensor of shape {tuple(keep.shape)}, got {shape}")
        if segment_ids.is_floating_point() or segment_ids.dtype == torch.bool or segment_ids.is_complex():
            raise ValueError(f"segment_ids must be an integer tensor, got dtype {segment_ids.dtype}")
    w = torch.zeros(keep.shape, dtype=torch.float64, device=keep.device)
    n_tokens = int(keep.sum())
    if n_tokens == 0:
        return w
    if agg == "token-mean":
        return w.masked_fill(keep, 1.0 / n_tokens)
    seq_tok = seq.unsqueeze(1).expand_as(keep)[keep]
    _, seq_index = torch.unique(seq_tok, return_inverse=True)
    n_seq = int(seq_index.max()) + 1
    if agg == "seq-mean-token-mean":
        group = seq_index
    else:
        segs = segment_ids.to(keep.device).long()[keep]
        span = segs.max() - segs.min() + 1
        _, group = torch.unique(seq_index * span + (segs - segs.min()), return_inverse=True)
    counts = torch.zeros(int(group.max()) + 1, dtype=torch.float64, device=keep.device)
    counts.index_add_(0, group, torch.ones_like(group, dtype=torch.float64))
    w[keep] = 1.0 / (counts[group] * n_seq)
    return w


@torch.no_grad()
def policy_loss_stats(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
) -> dict[str, float]:
    """Diagnostics of the policy update over the policy tokens (token means):

    * ``clip_fraction``: fraction of tokens where clipping is active (the clipped term is the larger loss),
      verl's ``pg_clipfrac``.
    * ``approx_kl``: mean of old_logp - logp (k1 estimate of KL(old || new), verl's ``ppo_kl``).
    * ``approx_kl_k3``: mean of (r - 1) - log r, the non-negative k3 estimate of the same KL.
    * ``ratio_mean``, ``ratio_min``, ``ratio_max`` and ``tokens``.
    """
    keep, clip_eps = _checked(logp, old_logp, advantages, mask, clip_eps)
    ratio, unclipped, clipped, _ = _token_terms(logp, old_logp, advantages, keep, clip_eps)
    n = int(keep.sum())
    if n == 0:
        names = (
            "clip_fraction",
            "approx_kl",
            "approx_kl_k3",
            "ratio_mean",
            "ratio_min",
            "ratio_max",
            "tokens",
        )
        return dict.fromkeys(names, 0.0)
    log_ratio = torch.log(ratio)
    on = ratio[keep]
    return {
        "clip_fraction": float((clipped > unclipped)[keep].float().mean()),
        "approx_kl": float((-log_ratio)[keep].mean()),
        "approx_kl_k3": float(((ratio - 1.0) - log_ratio)[keep].mean()),
        "ratio_mean": float(on.mean()),
        "ratio_min": float(on.min()),
        "ratio_max": float(on.max()),
        "tokens": float(n),
    }
