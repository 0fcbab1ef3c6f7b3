"""GEAR: a per-token weight from the teacher-student divergence on top of the base advantage (Eqs. 2-6).

A reweighting method: :func:`reweight` multiplies any estimate's advantages by GEAR's weight W_t, read off
:func:`~agentcredit.credit.methods.gear.maths.gear_details` (``maths.py``). The teacher's log-probs (the same tokens under the
ground-truth-conditioned context, ``teacher.py``), the student's and its entropies are signals the trainer computes.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.methods.base import GROUP_BASELINE, Method, Needs, Settings, register_signal
from agentcredit.credit.methods.gear.maths import (
    SEGMENTATIONS,
    TURN_HEAD_TOKENS,
    GearDetails,
    gear_advantages,
    gear_details,
)
from agentcredit.credit.methods.gear.teacher import TeacherLogprobs, signal_stats
from agentcredit.credit.signals import register_provider

__all__ = [
    "METHOD",
    "GearSettings",
    "SEGMENTATIONS",
    "GearDetails",
    "gear_advantages",
    "gear_details",
    "gear_reweight",
    "gear_reweight_stats",
]


class GearSettings(Settings):
    lambda_kl: float = Field(
        0.1, ge=0.0, le=1.0, description="Normalised rKL threshold that opens a segment (paper: 0.1)."
    )
    lambda_h: float = Field(1.5, gt=0.0, description="Entropy multiplier that closes a segment (paper: 1.5).")
    alpha: float = Field(0.2, ge=0.0, description="Modulation range (paper: 0.2).")
    beta: float | None = Field(None, description="Offset; None = 1 - 0.5 alpha (paper: 0.9).")
    template: str = Field(
        "{user}\n\nHere is a reference solution:\n{ground_truth}\n\n"
        "After understanding the reference solution, please try to solve this problem using your own approach below:",
        description="Ground-truth-conditioned teacher prompt (gear.md §2.2, OPSD style); placeholders {user}, {ground_truth}.",
    )
    normalize: Literal["minmax", "clamp_max", "auto"] = Field(
        "auto",
        description="rKL to [0, 1] per trajectory (paper §4.1: no formula): minmax (literal), clamp_max, or auto = "
        "minmax unless it triggers on > 20% of the tokens, then clamp_max (gear.md A3).",
    )
    break_at_observation: bool = Field(
        False,
        description="End a segment at the last token before a tool output (ours; the paper's scan runs over the "
        "policy tokens, so a segment may cross one: gear.md A5). Measured on kb-multihop ("
        "docs/results/gear-segments): ending there separated the deviating turn's W less than crossing.",
    )
    turn_head_tokens: int = Field(
        TURN_HEAD_TOKENS,
        ge=0,
        description="The first n policy tokens of each turn open no segment (ours, measured: "
        "docs/results/gear-segments): the turn's first token (the '<' of <think>) carries a prompt-shift spike of "
        "'limited semantic relevance' (seed lines 201, 355) whose entropy no later token exceeds 1.5 times, so it "
        "made one segment of the whole episode. "
        "0 = the paper's scan.",
    )
    reference: Literal["trajectory", "answer"] = Field(
        "trajectory",
        description="The teacher's ground truth: 'trajectory' = the task's scripted demonstration played through the "
        "protocol and tools (paper §3.3: s_t* is built 'under a reference trajectory tau*'); 'answer' = the gold "
        "answer only (a variant, not the paper's: the teacher then cannot disagree with a search step).",
    )


def gear_reweight(batch: EpisodeBatch, advantages: Tensor, **kw: Any) -> Tensor:
    """GEAR's weight W_t on top of any per-token advantage, along each episode's trained tokens (see
    :func:`gear_reweight_stats`, which also returns the step's segmentation statistics)."""
    return gear_reweight_stats(batch, advantages, **kw)[0]


def turn_starts(batch: EpisodeBatch, j: int, width: int) -> Tensor:
    """``[width]`` bool along episode j's trained tokens (:meth:`EpisodeBatch.gather`): True on the first token of
    each step that follows a tool output (:meth:`Episode.tool_turn_ends`), i.e. the first token of a new turn."""
    ep = batch.episodes[j]
    out = torch.zeros(width, dtype=torch.bool)
    offsets = [0]
    for s in ep.steps:
        offsets.append(offsets[-1] + s.length)
    for k in ep.tool_turn_ends():
        if k + 1 < len(ep.steps):
            out[offsets[k + 1]] = True
    return out


def gear_reweight_stats(
    batch: EpisodeBatch,
    advantages: Tensor,
    *,
    lambda_kl: float = 0.1,
    lambda_h: float = 1.5,
    alpha: float = 0.2,
    beta: float | None = None,
    normalisation: str = "minmax",
    break_at_observation: bool = False,
    turn_head_tokens: int = TURN_HEAD_TOKENS,
) -> tuple[Tensor, dict[str, float]]:
    """GEAR's weight W_t on top of any per-token advantage, and the statistics that show whether it reweights.

    GEAR's weight depends on the advantage only through its sign, so it is read off :func:`gear_details` at
    A = +1 and A = -1 and applied token by token (for a constant A this is exactly ``gear_advantages(A, ...)``).
    The layout's trained tokens hold no observation, so the turns (a turn ends at a tool output) come from the
    episode's steps (:func:`turn_starts`).

    Statistics (spec gear.md §12.4 and A3), over the trained tokens of every episode with one:
    ``gear/trigger_rate`` (share of tokens with r > lambda_KL, before propagation), ``gear/frac_in_segments``
    (share inside a segment) and ``gear/clamp_max_share`` (share of episodes normalised with clamp_max, which
    ``normalisation="auto"`` picks where min-max would trigger on more than 20% of the tokens). The paper
    describes the spikes as sparse; a trigger rate near 1 means min-max has gone flat and W is one constant per
    episode (GEAR becomes a scaled GRPO). Whether W varies along an episode:
    ``gear/w_turn{k}/neg`` and ``/pos`` (mean W over turn k's tokens, over the episodes with A < 0 / A > 0: the
    weight as applied), ``gear/w_turn_spread`` (per episode with A != 0 and two turns or more, the largest minus
    the smallest per-turn mean of W; 0 when W is one constant per episode) and ``gear/w_std`` (per episode with
    A != 0, the standard deviation of W over its tokens).
    """
    index = batch.token_index()
    student, mask = batch.gather(batch.need("student_logp", "gear"), index)
    teacher, _ = batch.gather(batch.need("teacher_logp", "gear").to(student.dtype), index)
    entropy, _ = batch.gather(batch.need("entropy", "gear"), index)
    a, _ = batch.gather(advantages, index)
    out = torch.zeros_like(a)
    kw = {
        "lambda_kl": lambda_kl,
        "lambda_h": lambda_h,
        "alpha": alpha,
        "beta": beta,
        "normalisation": normalisation,
        "break_at_observation": break_at_observation,
        "turn_head_tokens": turn_head_tokens,
    }
    tokens = triggers = in_segments = 0.0
    episodes = clamped = 0
    turn_w: dict[str, list[float]] = {}
    spreads, stds = [], []
    for j in range(a.shape[0]):
        # each sign's weight only where the episode has that sign (GRPO's A is one sign per episode); the A = +1
        # pass always runs, since its segmentation statistics describe the episode whatever its sign
        pos, neg = bool((a[j] > 0).any()), bool((a[j] < 0).any())
        starts = turn_starts(batch, j, a.shape[1])
        details = gear_details(1.0, student[j], teacher[j], entropy[j], mask[j], turn_starts=starts, **kw)
        w_pos = details.weights if pos else torch.ones_like(a[j])
        w_neg = (
            gear_details(-1.0, student[j], teacher[j], entropy[j], mask[j], turn_starts=starts, **kw).weights
            if neg
            else torch.ones_like(a[j])
        )
        weights = torch.where(a[j] > 0, w_pos, torch.where(a[j] < 0, w_neg, 1.0)).to(a.dtype)
        out[j] = weights * a[j]
        n = float(mask[j].sum())
        if n:
            tokens += n
            triggers += details.trigger_rate * n
            in_segments += details.frac_in_segments * n
            episodes += 1
            clamped += details.normalisation == "clamp_max"
            signed = mask[j] & (a[j] != 0)
            if signed.any():
                stds.append(float(weights[signed].std(correction=0)))
                sign = "pos" if float(a[j][signed][0]) > 0 else "neg"
                per_turn = [
                    float(weights[signed & (details.turn == k)].mean())
                    for k in range(int(details.turn.max()) + 1)
                    if (signed & (details.turn == k)).any()
                ]
                for k, w in enumerate(per_turn):
                    turn_w.setdefault(f"gear/w_turn{k}/{sign}", []).append(w)
                if len(per_turn) > 1:
                    spreads.append(max(per_turn) - min(per_turn))
    stats = {}
    if tokens:
        stats = {
            "gear/trigger_rate": triggers / tokens,
            "gear/frac_in_segments": in_segments / tokens,
            "gear/clamp_max_share": clamped / episodes,
        }
        if stds:
            stats["gear/w_std"] = math.fsum(stds) / len(stds)
        if spreads:
            stats["gear/w_turn_spread"] = math.fsum(spreads) / len(spreads)
        stats.update({name: math.fsum(v) / len(v) for name, v in sorted(turn_w.items())})
    return batch.scatter(out, index), stats


def reweight(batch: EpisodeBatch, estimate: Estimate, settings: GearSettings) -> Estimate:
    """GEAR's weight on the estimate's advantages. Under a split min (PORTool App. B) each term is its own clipped
    objective, so GEAR weighs each by its own sign and the total stays their sum; the segmentation statistics do
    not depend on the sign, so the first term's describe the step."""
    kw = {
        "lambda_kl": settings.lambda_kl,
        "lambda_h": settings.lambda_h,
        "alpha": settings.alpha,
        "beta": settings.beta,
        "normalisation": settings.normalize,
        "break_at_observation": settings.break_at_observation,
        "turn_head_tokens": settings.turn_head_tokens,
    }
    if estimate.parts is None:
        estimate.advantages, stats = gear_reweight_stats(batch, estimate.advantages, **kw)
    else:
        reweighted = [gear_reweight_stats(batch, part, **kw) for part in estimate.parts]
        estimate.parts = tuple(adv for adv, _ in reweighted)
        estimate.advantages = torch.stack(estimate.parts).sum(0)
        stats = reweighted[0][1]
    estimate.stats.update(stats)
    return estimate


TEACHER_LOGP = register_signal(
    "teacher_logp",
    "the ground-truth-conditioned teacher's log-probs of the student's own tokens, [N, L] (gear.md §2.2)",
)


class GearVerlSettings(GearSettings):
    """verl's ``agentcredit.gear``: the native ``algorithm.gear`` section (GEAR's settings and teacher template,
    ``reference: trajectory``, the paper's tau*, by default, built on the worker as on the native trainer), plus
    where verl reads the student's log-probs."""

    student_logprobs: Literal["rollout", "old"] = Field(
        "rollout",
        description=(
            "student log-probs: 'rollout' (the inference engine, the same engine that scores the teacher, so the "
            "rKL has no precision mismatch; needs rollout.calculate_log_probs=True) or 'old' (training engine)."
        ),
    )


def verl_config_errors(config: Any, settings: GearVerlSettings, method: str) -> list[str]:
    """verl's config (its Hydra tree: nodes with ``.get``) for where GEAR reads the student's log-probs."""
    rollout = config.get("actor_rollout_ref").get("rollout")
    if settings.student_logprobs == "rollout" and not rollout.get("calculate_log_probs"):
        return [
            f"agentcredit.{METHOD.section}.student_logprobs=rollout needs "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        ]
    return []


METHOD = Method(
    name="gear",
    settings=GearSettings,
    trainer_settings=(("verl", GearVerlSettings),),
    # loss: paper Eq. 1 / 6 (seed lines 66, 315), 1/|tau| per trajectory (gear.md A12)
    needs=Needs(
        signals=frozenset({"teacher_logp", "student_logp", "entropy"}), loss_agg="seq-mean-token-mean"
    ),
    source="GEAR Eqs. 2-6",
    reweight=reweight,
    signal_stats=signal_stats,
    modifier="reweight",
    base=GROUP_BASELINE,
    trainer_checks=(("verl", verl_config_errors),),
    # the share of policy tokens whose normalised rKL triggers a segment, the share inside a segment, and the share
    # of episodes normalised with clamp_max (gear.md §12.4, A3; the paper describes spikes as sparse)
    diagnostics=(
        ("gear/trigger_rate", "GEAR trigger rate"),
        ("gear/frac_in_segments", "GEAR tokens in segments"),
        ("gear/clamp_max_share", "GEAR clamp_max share"),
    ),
)

register_provider(TeacherLogprobs)
