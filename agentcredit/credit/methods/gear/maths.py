"""gear: reweight a GRPO advantage token by token with self-distillation divergence and entropy segments.

Paper: "GEAR: Granularity-adaptive Advantage Reweighting via Self-Distillation" (spec ``gear.md`` Sec. 2-4,
Algorithm 1). For one trajectory with trajectory-level advantage A (GRPO, Sec. 3.2) and its policy tokens
t = 1..T (observation tokens are skipped everywhere: the scan runs over the compacted policy tokens)::

    rKL_t   = log pi(a_t | s_t) - log pi(a_t | s_t*)        Eq. 2, s_t* = the ground-truth-conditioned context
    r_t     = (rKL_t - min rKL) / (max rKL - min rKL)       "normalise to [0, 1] within each trajectory";
                                                            all 0 when max == min
    segments: a token with r_t > lambda_KL opens a segment [t_start, t_end] that ends at the first later token
              with H_t > lambda_H * H_{t_start} (that token included) or at the last token; the scan resumes
              at t_end + 1                                  Sec. 4.2, Algorithm 1 lines 9-20
    w^KL_t  = r_{t_n} inside segment n (the onset's value), r_t elsewhere                         Eq. 3
    w_t     = 0.5 + (0.5 - w^KL_t) * sign(A)                                                       Eq. 4
    W_t     = alpha * w_t + beta,   beta = 1 - 0.5 * alpha                                         Eq. 5
    A_hat_t = W_t * A                                       replaces A in the GRPO objective,      Eq. 6

Paper values: lambda_KL = 0.1, lambda_H = 1.5, alpha = 0.2 (so beta = 0.9). ``alpha = 0`` gives GRPO back.
The paper names no normalisation formula; min-max is the literal reading (spec A3). The spec's reference code
adds 1e-8 to the denominator; here max == min is handled explicitly instead, so the spike of the worked
example normalises to exactly 1.0 as the spec's table states. Comparisons are strict (spec A7).

Ablation switches (spec Sec. 9.2, ``segmentation=``): ``"none"`` (w^KL = r), ``"kl_only"`` (each trigger starts
a segment that runs to the next trigger), ``"entropy_only"`` (partition by the entropy test alone),
``"tool_call"`` (segments start at the first token of each tool invocation) and ``"entropy_window"`` (the end
test uses the trailing mean entropy of ``entropy_window`` tokens). ``normalisation="clamp_max"`` is spec A3's
alternative, max(rKL, 0) / max(max(rKL, 0)); ``"auto"`` is min-max unless it makes more than 20% of the tokens
triggers, then clamp_max (spec A3).

Turns (ours; the paper's scan runs over the policy tokens and says nothing of turns): a turn ends at an
observation (a gap in the mask, or ``turn_starts``). ``turn_head_tokens`` (default :data:`TURN_HEAD_TOKENS` = 1):
the first tokens of each turn open no segment (they keep their own r, Eq. 3's "otherwise"), since the turn's opening
token carries the prompt-shift spike (measured, see the constant). ``break_at_observation`` ends a segment at the
last token of its turn; off by default: segments run across observations, as the paper's scan over the policy
tokens does (spec A5), and on kb-multihop ending them there separated the deviating turn less (0.029, SD 0.052,
24 of 28, with the first token skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from agentcredit.credit._validate import (
    as_mask,
    choice,
    finite_float,
    finite_where,
    float_tensor,
    result_dtype,
    same_shape,
)

__all__ = [
    "gear_advantages",
    "gear_details",
    "GearDetails",
    "SEGMENTATIONS",
    "NORMALISATIONS",
    "AUTO_MAX_TRIGGER_RATE",
    "TURN_HEAD_TOKENS",
]

Segmentation = Literal["gear", "none", "kl_only", "entropy_only", "tool_call", "entropy_window"]
SEGMENTATIONS: tuple[str, ...] = ("gear", "none", "kl_only", "entropy_only", "tool_call", "entropy_window")
Normalisation = Literal["minmax", "clamp_max", "auto"]
NORMALISATIONS: tuple[str, ...] = ("minmax", "clamp_max", "auto")
# "auto": min-max, unless more than this share of the trajectory's policy tokens then triggers (r > lambda_KL), in
# which case clamp_max. Spec gear.md A3: with min-max a strongly negative minimum (the teacher far surer of the
# answer tokens) lifts the typical rKL ~ 0 tokens above lambda_KL and turns most tokens into triggers; "the paper
# describes spikes as sparse (a minority of tokens). If the trigger rate is high (e.g. > 20%), switch to clamp_max
# and report it". The paper: "occasional reverse-KL spikes" (GEAR §5.3, seed line 195).
AUTO_MAX_TRIGGER_RATE = 0.2

# The first policy tokens of each turn that do not open a segment (ours; the paper's scan is 0). On
# kb-multihop the turn's first token (the "<" of "<think>") carries the spike of the prompt shift between student
# and teacher, of "limited semantic relevance" (GEAR §5.4 and App. C.2, seed lines 201, 355), with an entropy so
# high (4.8-5.1 nats) that no later token exceeds lambda_H times it: it opened one segment over the whole episode,
# W was one constant and GEAR a rescaled GRPO. Skipping the turn's first token separates the deviating turn's W
# from the others' (the measurement, on scripted failing kb-multihop episodes: docs/results/gear-segments/README.md).
TURN_HEAD_TOKENS = 1

# Entropies computed as logsumexp - E[logits] can come out a hair below zero in float32; anything more negative
# than this is not an entropy (e.g. log-probs passed by mistake).
_ENTROPY_TOLERANCE = 1e-5


@dataclass(frozen=True)
class GearDetails:
    """All intermediate GEAR quantities of one trajectory, ``[T]`` tensors with 0 where ``mask == 0``."""

    advantages: Tensor  # A_hat = W * A
    weights: Tensor  # W
    rkl: Tensor  # raw rKL
    rkl_norm: Tensor  # r in [0, 1]
    w_kl: Tensor  # w^KL after propagating onsets over segments
    segment_id: Tensor  # int64, segment index per token, -1 outside segments and off the mask
    segments: list[tuple[int, int]]  # (start, end) token indices into the full sequence, end inclusive
    trigger_rate: float  # fraction of policy tokens with r > lambda_KL (before propagation)
    frac_in_segments: float  # fraction of policy tokens inside a segment
    normalisation: str = "minmax"  # the normalisation applied ("auto" resolves to minmax or clamp_max)
    turn: Tensor | None = None  # int64, turn index per token (a turn ends at an observation), -1 off the mask


def gear_details(
    advantage: float,
    student_logp: Tensor,
    teacher_logp: Tensor,
    entropy: Tensor,
    mask: Tensor,
    *,
    lambda_kl: float = 0.1,
    lambda_h: float = 1.5,
    alpha: float = 0.2,
    beta: float | None = None,
    normalisation: Normalisation = "minmax",
    segmentation: Segmentation = "gear",
    entropy_window: int = 8,
    tool_call_starts: Tensor | None = None,
    break_at_observation: bool = False,
    turn_starts: Tensor | None = None,
    turn_head_tokens: int = TURN_HEAD_TOKENS,
) -> GearDetails:
    """GEAR for one trajectory with every intermediate quantity (see :func:`gear_advantages`)."""
    adv = finite_float(advantage, "advantage")
    for name, t in (("student_logp", student_logp), ("teacher_logp", teacher_logp), ("entropy", entropy)):
        float_tensor(t, name)
    shape = same_shape(
        {"student_logp": student_logp, "teacher_logp": teacher_logp, "entropy": entropy}, ndim=1
    )
    keep = as_mask(mask, "mask", shape)
    lambda_kl = finite_float(lambda_kl, "lambda_kl")
    lambda_h = finite_float(lambda_h, "lambda_h")
    alpha = finite_float(alpha, "alpha")
    beta = 1.0 - 0.5 * alpha if beta is None else finite_float(beta, "beta")
    if alpha < 0 or lambda_h < 0:
        raise ValueError(f"alpha and lambda_h must be >= 0, got alpha={alpha}, lambda_h={lambda_h}")
    choice(normalisation, "normalisation", NORMALISATIONS)
    choice(segmentation, "segmentation", SEGMENTATIONS)
    if isinstance(entropy_window, bool) or not isinstance(entropy_window, int) or entropy_window < 1:
        raise ValueError(f"entropy_window must be a positive int, got {entropy_window!r}")
    if break_at_observation and segmentation not in ("gear", "entropy_window"):
        raise ValueError('break_at_observation applies to segmentation="gear" or "entropy_window" only')
    if isinstance(turn_head_tokens, bool) or not isinstance(turn_head_tokens, int) or turn_head_tokens < 0:
        raise ValueError(f"turn_head_tokens must be an int >= 0, got {turn_head_tokens!r}")
    for name, t in (("student_logp", student_logp), ("teacher_logp", teacher_logp), ("entropy", entropy)):
        finite_where(t, name, keep)
    if bool((keep & (entropy < -_ENTROPY_TOLERANCE)).any()):
        bad = int((keep & (entropy < -_ENTROPY_TOLERANCE)).nonzero()[0])
        raise ValueError(f"entropy must be >= 0 on policy tokens; entropy[{bad}] = {entropy[bad].item()}")

    dtype = result_dtype(student_logp, teacher_logp, entropy)
    device = student_logp.device
    idx = keep.nonzero().flatten()
    n = idx.numel()
    rkl_c = (student_logp[idx].to(dtype) - teacher_logp[idx].to(dtype)).detach()
    applied = normalisation
    if normalisation == "auto":
        r = _normalise(rkl_c, "minmax")
        applied = "clamp_max" if n and float((r > lambda_kl).sum()) / n > AUTO_MAX_TRIGGER_RATE else "minmax"
    r = _normalise(rkl_c, applied)

    r_list = r.tolist()
    h_list = entropy[idx].to(dtype).tolist()
    if segmentation == "tool_call":
        starts = _tool_call_starts(tool_call_starts, keep, idx)
    elif tool_call_starts is not None:
        raise ValueError('tool_call_starts is only used by segmentation="tool_call"')
    turn_c = _turn_index(turn_starts, keep, idx)
    if segmentation in ("gear", "entropy_window"):
        end_signal = h_list if segmentation == "gear" else _trailing_mean(h_list, entropy_window)
        turn_list = turn_c.tolist()
        # a new turn begins after each observation: with break_at_observation the segment open there closes
        new_turn = [t > 0 and turn_list[t] != turn_list[t - 1] for t in range(n)]
        gap_before = new_turn if break_at_observation else [False] * n
        # the first turn_head_tokens policy tokens of each turn do not open a segment
        head = [False] * n
        if turn_head_tokens:
            at = 0
            for t in range(n):
                at = 0 if t == 0 or new_turn[t] else at + 1
                head[t] = at < turn_head_tokens
        segs = _scan_gear(r_list, h_list, end_signal, gap_before, head, lambda_kl, lambda_h)
    elif segmentation == "kl_only":
        triggers = [t for t in range(n) if r_list[t] > lambda_kl]
        segs = _consecutive(triggers, n)
    elif segmentation == "entropy_only":
        segs = _scan_entropy_partition(h_list, lambda_h)
    elif segmentation == "tool_call":
        segs = _consecutive(starts, n, include_head=True)
    else:
        segs = []

    # Propagate each onset's value over its segment (Eq. 3) without a per-token Python loop: mark starts and
    # ends, take the running coverage count, and look up the latest start at or before every covered token.
    positions_c = torch.arange(n, device=device)
    seg_id_c = torch.full((n,), -1, dtype=torch.long, device=device)
    src = positions_c
    if segs:
        starts_t = torch.tensor([st for st, _ in segs], dtype=torch.long, device=device)
        ends_t = torch.tensor([en for _, en in segs], dtype=torch.long, device=device)
        change = torch.zeros(n + 1, dtype=torch.long, device=device)
        change.index_add_(0, starts_t, torch.ones_like(starts_t))
        change.index_add_(0, ends_t + 1, -torch.ones_like(ends_t))
        covered = change.cumsum(0)[:n] > 0
        marker = torch.full((n,), -1, dtype=torch.long, device=device)
        marker[starts_t] = starts_t
        src = torch.where(covered, marker.cummax(0).values, positions_c)
        seg_id_c = torch.where(covered, (marker >= 0).long().cumsum(0) - 1, seg_id_c)
    w_kl_c = r[src]
    sign = (adv > 0) - (adv < 0)
    weights_c = alpha * (0.5 + (0.5 - w_kl_c) * sign) + beta

    def scatter(values: Tensor, fill: float | int = 0, out_dtype: torch.dtype = dtype) -> Tensor:
        out = torch.full(shape, fill, dtype=out_dtype, device=device)
        out[idx] = values.to(out_dtype)
        return out

    in_segments = sum(e - s + 1 for s, e in segs)
    positions = idx.tolist()
    return GearDetails(
        advantages=scatter(weights_c * adv),
        weights=scatter(weights_c),
        rkl=scatter(rkl_c),
        rkl_norm=scatter(r),
        w_kl=scatter(w_kl_c),
        segment_id=scatter(seg_id_c, -1, torch.long),
        segments=[(positions[s], positions[e]) for s, e in segs],
        trigger_rate=float((r > lambda_kl).sum()) / n if n else 0.0,
        frac_in_segments=in_segments / n if n else 0.0,
        normalisation=applied,
        turn=scatter(turn_c, -1, torch.long),
    )


def gear_advantages(
    advantage: float,
    student_logp: Tensor,
    teacher_logp: Tensor,
    entropy: Tensor,
    mask: Tensor,
    *,
    lambda_kl: float = 0.1,
    lambda_h: float = 1.5,
    alpha: float = 0.2,
    beta: float | None = None,
    normalisation: Normalisation = "minmax",
    segmentation: Segmentation = "gear",
    entropy_window: int = 8,
    tool_call_starts: Tensor | None = None,
    break_at_observation: bool = False,
    turn_starts: Tensor | None = None,
    turn_head_tokens: int = TURN_HEAD_TOKENS,
) -> Tensor:
    """GEAR token advantages of one trajectory.

    Args:
        advantage: the trajectory's GRPO advantage A (see :func:`agentcredit.credit.methods.grpo.grpo_advantages`).
        student_logp: ``[T]`` log pi_old(a_t | s_t) of the sampled tokens.
        teacher_logp: ``[T]`` log pi_old(a_t | s_t*) of the same tokens under the ground-truth context.
        entropy: ``[T]`` full-vocabulary entropy H_t of the student (nats).
        mask: ``[T]`` bool or 0/1, 1 on policy tokens. Only those positions are read.
        lambda_kl: onset threshold on the normalised rKL (paper value 0.1).
        lambda_h: entropy ratio that ends a segment (paper value 1.5).
        alpha: modulation range (paper value 0.2; 0 returns A unchanged).
        beta: offset; None means 1 - 0.5 * alpha (paper: beta = 0.9 at alpha = 0.2).
        normalisation: ``"minmax"`` (the literal reading of the paper's "normalize to [0, 1]"), ``"clamp_max"``
            (spec A3) or ``"auto"`` (min-max, clamp_max for a trajectory where min-max triggers on more than
            :data:`AUTO_MAX_TRIGGER_RATE` of the tokens; spec A3).
        segmentation: ``"gear"`` (paper) or an ablation of spec Sec. 9.2 (see the module docstring).
        entropy_window: window of ``"entropy_window"`` (paper ablation: 8 tokens).
        tool_call_starts: ``[T]`` bool, True on the first token of each tool invocation (``"tool_call"`` only).
        break_at_observation: end a segment at the last token of its turn (default False: segments may cross an
            observation, as the paper's scan does; ours when True).
        turn_starts: ``[T]`` bool, True on the first policy token of each turn after the first, for a layout whose
            mask has no gap at the observations; a gap in the mask always starts a new turn.
        turn_head_tokens: the first n tokens of each turn open no segment (ours, measured:
            :data:`TURN_HEAD_TOKENS`; 0 = the paper's scan). Read by ``"gear"`` and ``"entropy_window"``; the
            other ablations keep the spec's definitions.

    Returns:
        ``[T]`` advantages W_t * A on policy tokens, 0 where ``mask == 0``, in the promoted float dtype of the
        tensor inputs.
    """
    return gear_details(
        advantage,
        student_logp,
        teacher_logp,
        entropy,
        mask,
        lambda_kl=lambda_kl,
        lambda_h=lambda_h,
        alpha=alpha,
        beta=beta,
        normalisation=normalisation,
        segmentation=segmentation,
        entropy_window=entropy_window,
        tool_call_starts=tool_call_starts,
        break_at_observation=break_at_observation,
        turn_starts=turn_starts,
        turn_head_tokens=turn_head_tokens,
    ).advantages


def _normalise(rkl: Tensor, mode: str) -> Tensor:
    if rkl.numel() == 0:
        return rkl
    if mode == "clamp_max":
        pos = rkl.clamp(min=0)
        top = pos.max()
        return pos / top if top > 0 else torch.zeros_like(rkl)
    lo, hi = rkl.min(), rkl.max()
    return (rkl - lo) / (hi - lo) if hi > lo else torch.zeros_like(rkl)


# The scans below are plain Python loops over the compacted policy tokens: each token is visited once
# (a segment's end search resumes the outer scan after it), so a trajectory costs O(T); no library offers
# this data-dependent sequential segmentation.


def _scan_gear(
    r: list[float],
    h: list[float],
    end_signal: list[float],
    gap_before: list[bool],
    head: list[bool],
    lambda_kl: float,
    lambda_h: float,
) -> list[tuple[int, int]]:
    n = len(r)
    segs: list[tuple[int, int]] = []
    t = 0
    while t < n:
        if head[t] or not r[t] > lambda_kl:
            t += 1
            continue
        # no terminator: the segment runs to the last policy token (spec A6), or with break_at_observation to the
        # last token of its turn
        start, end = t, n - 1
        threshold = lambda_h * h[start]
        for u in range(start + 1, n):
            if gap_before[u]:  # break_at_observation: close before the observation
                end = u - 1
                break
            if end_signal[u] > threshold:
                end = u
                break
        segs.append((start, end))
        t = end + 1
    return segs


def _scan_entropy_partition(h: list[float], lambda_h: float) -> list[tuple[int, int]]:
    n = len(h)
    segs: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end = n - 1
        for u in range(start + 1, n):
            if h[u] > lambda_h * h[start]:
                end = u
                break
        segs.append((start, end))
        start = end + 1
    return segs


def _consecutive(starts: list[int], n: int, *, include_head: bool = False) -> list[tuple[int, int]]:
    """Segments [s_j, s_{j+1} - 1], the last to n - 1; with ``include_head`` tokens before s_0 form one more."""
    bounds = sorted(set(starts))
    if include_head and n and (not bounds or bounds[0] != 0):
        bounds = [0] + bounds
    return [(s, (bounds[j + 1] - 1) if j + 1 < len(bounds) else n - 1) for j, s in enumerate(bounds)]


def _trailing_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _turn_index(turn_starts: Tensor | None, keep: Tensor, idx: Tensor) -> Tensor:
    """Turn index of each policy token: a turn begins after each observation, read off a gap in the mask (an
    observation between two policy tokens) or off ``turn_starts`` (True on a turn's first token, for a layout that
    has already dropped the observations)."""
    starts = torch.zeros(idx.numel(), dtype=torch.bool, device=idx.device)
    if idx.numel() > 1:
        starts[1:] = (idx[1:] - idx[:-1]) > 1
    if turn_starts is not None:
        flags = as_mask(turn_starts, "turn_starts", keep.shape)
        off = flags & ~keep
        if bool(off.any()):
            raise ValueError(f"turn_starts[{int(off.nonzero()[0])}] is True on a token with mask == 0")
        starts |= flags[idx]
    if idx.numel():
        starts[0] = False  # the first policy token opens turn 0
    return starts.long().cumsum(0)


def _tool_call_starts(starts: Tensor | None, keep: Tensor, idx: Tensor) -> list[int]:
    if starts is None:
        raise ValueError(
            'segmentation="tool_call" needs tool_call_starts (True on each tool call\'s first token)'
        )
    flags = as_mask(starts, "tool_call_starts", keep.shape)
    off = flags & ~keep
    if bool(off.any()):
        raise ValueError(f"tool_call_starts[{int(off.nonzero()[0])}] is True on a token with mask == 0")
    return flags[idx].nonzero().flatten().tolist()
