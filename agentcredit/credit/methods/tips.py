"""TIPS: turn-level rewards from a teacher's potential Phi, then the base estimate (Eqs. 17-20, Table 10).

A shaping method: :func:`tips_step_rewards` puts the turn rewards ``alpha [Phi(S_k) - Phi(S_{k-1})]`` (and the
outcome minus ``alpha Phi(S_M)``) on the steps; the estimate (PPO's GAE as published, or carl-segment) reads them.
The potentials and the batch's alpha are signals the trainer computes with a lagged teacher. The maths is
:func:`tips_turn_rewards`: turn rewards from a teacher's information potential (potential-based shaping).

Paper: "TIPS: Turn-level Information-Potential reward Shaping" (spec ``tips.md`` Sec. 3). S_0 is the prompt and
S_k the context after the k-th tool observation (k = 1..M). The potential is the teacher's log-likelihood of
any gold answer, Phi(S) = log sum_a p_teach(a | S) (Eq. 15-16; :func:`tips_potential`). The reward of the
assistant message that ends turn k is (Eqs. 17-18)::

    r_k     = alpha * (Phi(S_k) - Phi(S_{k-1}))          k = 1..M (tool turns)
    r_{M+1} = outcome - alpha * Phi(S_M)                 final message: outcome plus the terminal correction,
                                                         since Phi(S_K) = 0 on the terminal state (Eq. 20)

so the rewards telescope to outcome - alpha * Phi(S_0), a per-prompt constant (Eq. 21-25): the optimal policy
is unchanged, and TIPS helps through the learned critic. Put r_k on the last policy token of assistant message
k (:func:`tips_token_rewards`) and run :func:`agentcredit.credit.methods.ppo.gae_advantages` with gamma = lam = 1
(Table 10). Under GRPO the shaping cancels (spec Sec. 3.9), so TIPS needs a token-level estimator.

Released-code options (spec Sec. 8, reference-compatible presets): ``no_tool_shaping="none"`` reproduces the
code's M = 0 quirk (no -alpha * Phi(S_0) when there was no tool call); ``terminal_potential="hold"`` is the
ablation Phi(S_K) = Phi(S_{K-1}) (no terminal correction, not strictly potential-based).
:func:`tips_batch_alpha` is the code's per-batch scale control ("immediate scale control").
The signals come from :class:`TeacherPotentials`, which scores Phi (:func:`tips_potential_terms`) with the
trainer's model-side capabilities (:class:`~agentcredit.credit.signals.ProviderContext`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from agentcredit.credit._validate import as_int, as_mask, choice, finite_float, float_list
from agentcredit.credit.estimators import EpisodeBatch, outcome_part
from agentcredit.credit.methods.base import CRITIC_BASELINE, Method, Needs, Settings, register_signal
from agentcredit.credit.signals import (
    ContinuationScorer,
    ProviderContext,
    SignalProvider,
    register_provider,
)

__all__ = [
    "METHOD",
    "answer_token_span",
    "TipsSettings",
    "tips_batch_alpha",
    "tips_potential",
    "tips_step_alpha",
    "tips_step_rewards",
    "tips_teacher_refresh_due",
    "tips_token_rewards",
    "tips_turn_rewards",
]


def tips_turn_rewards(
    potentials: Sequence[float] | Tensor,
    outcome: float,
    *,
    alpha: float,
    no_tool_shaping: Literal["paper", "none"] = "paper",
    terminal_potential: Literal["zero", "hold"] = "zero",
) -> list[float]:
    """Turn rewards of one episode with M tool turns.

    Args:
        potentials: ``[Phi(S_0), ..., Phi(S_M)]`` (M + 1 values, at least one).
        outcome: the outcome reward (EM, plus the 0.2 format bonus in the released training code).
        alpha: shaping scale (>= 0; the paper picks it so that E|alpha * dPhi| ~ 0.2, or per batch with
            :func:`tips_batch_alpha`).
        no_tool_shaping: ``"paper"`` (default: the answer of an M = 0 episode still gets -alpha * Phi(S_0)) or
            ``"none"`` (released code: no shaping at all when M = 0).
        terminal_potential: ``"zero"`` (default, Eq. 20: Phi(S_K) = 0) or ``"hold"`` (ablation: the final
            message gets the bare outcome).

    Returns:
        M + 1 rewards, one per assistant message, the final answer message last.
    """
    phi = float_list(potentials, "potentials", min_len=1)
    outcome = finite_float(outcome, "outcome")
    alpha = finite_float(alpha, "alpha")
    if alpha < 0:
        raise ValueError(
            f"alpha must be >= 0 (the paper requires alpha > 0; 0 disables shaping), got {alpha}"
        )
    choice(no_tool_shaping, "no_tool_shaping", ("paper", "none"))
    choice(terminal_potential, "terminal_potential", ("zero", "hold"))
    turns = [alpha * (phi[k] - phi[k - 1]) for k in range(1, len(phi))]
    no_correction = terminal_potential == "hold" or (len(phi) == 1 and no_tool_shaping == "none")
    final = outcome if no_correction else outcome - alpha * phi[-1]
    return turns + [final]


def tips_potential(
    answer_logprobs: Sequence[Sequence[float] | Tensor],
    *,
    reduce: Literal["sum", "mean"] = "sum",
    aggregate: Literal["lse", "mean", "max"] = "lse",
) -> float:
    """Phi(S) from the teacher's token log-probs of each gold-answer continuation given S.

    ``answer_logprobs[a]`` holds log p_teach(z_j | S, z_<j) for the tokens of alias a (de-duplicate aliases
    before scoring). Per alias, ``reduce`` sums them (the paper's sequence log-prob, Eq. 16) or averages them
    (the released code's ``length_norm``); across aliases, ``aggregate`` takes logsumexp (Eq. 15, paper and
    code), the arithmetic mean (App. H.1 pseudo-code) or the max. Defaults are the paper's ``sum`` + ``lse``;
    the released-code preset is ``reduce="mean"``.
    """
    choice(reduce, "reduce", ("sum", "mean"))
    choice(aggregate, "aggregate", ("lse", "mean", "max"))
    if isinstance(answer_logprobs, str | bytes) or not isinstance(answer_logprobs, Sequence):
        raise ValueError("answer_logprobs must be a sequence with one list of token log-probs per alias")
    if not answer_logprobs:
        raise ValueError("answer_logprobs is empty: give at least one gold-answer alias")
    scores = []
    for a, logprobs in enumerate(answer_logprobs):
        values = float_list(logprobs, f"answer_logprobs[{a}]", min_len=1)
        for j, v in enumerate(values):
            if v > 0.0:
                raise ValueError(f"answer_logprobs[{a}][{j}] = {v} is not a log-probability (must be <= 0)")
        total = math.fsum(values)
        scores.append(total if reduce == "sum" else total / len(values))
    if aggregate == "max":
        return max(scores)
    if aggregate == "mean":
        return math.fsum(scores) / len(scores)
    top = max(scores)
    return top + math.log(math.fsum(math.exp(s - top) for s in scores))


def tips_batch_alpha(
    delta_potentials: Sequence[float] | Tensor,
    *,
    target_mean_abs: float = 0.11,
    min_abs: float = 1e-8,
) -> float | None:
    """Per-batch alpha of the released code's scale control: target / mean |dPhi| over non-zero deltas.

    ``delta_potentials`` are the raw Phi(S_k) - Phi(S_{k-1}) of every tool turn in the batch (terminal
    corrections excluded). The code's default target is 0.11 (the midpoint of its [0.02, 0.2] band); the
    paper's fixed-alpha rule corresponds to 0.2. Returns None when no delta exceeds ``min_abs`` (keep the
    previous alpha); alpha must stay constant within the batch for the shaping to be potential-based.
    """
    deltas = float_list(delta_potentials, "delta_potentials")
    target = finite_float(target_mean_abs, "target_mean_abs")
    floor = finite_float(min_abs, "min_abs")
    if target <= 0:
        raise ValueError(f"target_mean_abs must be > 0, got {target}")
    big = [abs(d) for d in deltas if abs(d) > floor]
    if not big:
        return None
    return target / (math.fsum(big) / len(big))


def tips_step_alpha(
    potentials: Sequence[Sequence[float]],
    *,
    mode: str,
    alpha: float,
    target_mean_abs: float,
    previous: float | None = None,
) -> float:
    """The alpha one batch is shaped with, in either trainer.

    ``mode="fixed"``: ``alpha`` (the paper). ``mode="batch_target"``: :func:`tips_batch_alpha` over the batch's
    turn deltas Phi(S_k) - Phi(S_{k-1}) (``potentials`` holds Phi at each policy segment's start, per
    trajectory); a batch without a non-zero delta keeps ``previous``, or ``alpha`` when there is none yet (the
    released code's start value).
    """
    if mode == "fixed":
        return float(alpha)
    if mode != "batch_target":
        raise ValueError(f"tips alpha mode must be 'fixed' or 'batch_target', got {mode!r}")
    deltas = [p[k] - p[k - 1] for p in potentials for k in range(1, len(p))]
    batch = tips_batch_alpha(deltas, target_mean_abs=target_mean_abs)
    if batch is not None:
        return batch
    return float(previous) if previous is not None else float(alpha)


def tips_token_rewards(
    turn_rewards: Sequence[float],
    positions: Sequence[int],
    mask: Tensor,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Place turn rewards on tokens of one response: ``out[positions[k]] += turn_rewards[k]``.

    ``positions[k]`` must be a policy token (``mask == 1``): the last policy token of assistant message k
    (the reward of the transition landing in S_k, Eq. 17), and for the final reward the last policy token of
    the response. Masked GAE discards rewards on observation tokens (spec Sec. 8 item 13), so a position off
    the mask is an error here rather than a silent loss. Returns a ``[T]`` tensor (default float dtype unless
    ``dtype``), for one row of :func:`agentcredit.credit.methods.ppo.gae_advantages`'s ``token_rewards``.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 1:
        raise ValueError("mask must be a 1-D tensor [T] (bool or 0/1)")
    keep = as_mask(mask, "mask", mask.shape)
    rewards = float_list(turn_rewards, "turn_rewards")
    if isinstance(positions, Tensor):
        positions = positions.tolist()
    if len(positions) != len(rewards):
        raise ValueError(f"positions has {len(positions)} entries but turn_rewards has {len(rewards)}")
    length = keep.shape[0]
    out = torch.zeros(length, dtype=dtype or torch.get_default_dtype(), device=mask.device)
    for k, (pos, r) in enumerate(zip(positions, rewards, strict=True)):
        pos = as_int(pos, f"positions[{k}]")
        if not 0 <= pos < length:
            raise ValueError(f"positions[{k}] = {pos} is not a token index in 0..{length - 1}")
        if not bool(keep[pos]):
            raise ValueError(
                f"positions[{k}] = {pos} is not a policy token (mask == 0); GAE would drop its reward"
            )
        out[pos] += r
    return out


def tips_teacher_refresh_due(updates_done: int, refresh_every: int) -> bool:
    """Whether the teacher becomes a copy of the policy after the ``updates_done``-th update (both trainers).

    The teacher starts as the initial policy and is replaced after every ``refresh_every``-th update, between
    batches only (tips.md Sec. 4.2: a lagged snapshot, N = 200 in the paper), so a batch's potentials all come
    from one teacher. ``refresh_every = 1`` makes the teacher the policy that sampled the batch.
    """
    updates_done = as_int(updates_done, "updates_done")
    refresh_every = as_int(refresh_every, "refresh_every")
    if updates_done < 1 or refresh_every < 1:
        raise ValueError(
            f"updates_done and refresh_every must be >= 1, got {updates_done} and {refresh_every}"
        )
    return updates_done % refresh_every == 0


class TipsSettings(Settings):
    """TIPS's shaping settings: both trainers pass them to the same :func:`tips_step_rewards` and refresh their
    teacher on the same schedule."""

    alpha: float = Field(
        0.2, ge=0.0, description="Shaping scale alpha (paper: fixed so E|alpha dPhi| ~ 0.2)."
    )
    alpha_mode: Literal["fixed", "batch_target"] = Field(
        "fixed",
        description="'fixed' (paper) or 'batch_target': per-batch alpha so mean |alpha dPhi| = target (code).",
    )
    target_mean_abs: float = Field(
        0.11, gt=0.0, description="batch_target mode: target mean |alpha dPhi| (code: 0.11)."
    )
    no_tool_shaping: Literal["paper", "none"] = Field(
        "paper", description="M = 0 episodes: the paper's -alpha Phi(S_0) correction, or none (code quirk)."
    )
    terminal_potential: Literal["zero", "hold"] = Field(
        "zero", description="Phi(S_K) = 0 (Eq. 20) or the ablation that holds it."
    )
    refresh_every: int = Field(
        200,
        ge=1,
        description=(
            "Teacher = policy snapshot refreshed after every K-th update (paper: 200); K = 1: the current policy."
        ),
    )
    # One option for both trainers (verl's block used to spell it `reduce` / `aggregate`): the paper and the
    # released code both take the logsumexp over aliases, they differ in how one alias's tokens are pooled.
    potential: Literal["paper", "code"] = Field(
        "paper",
        description="'paper': sum of answer log-probs, logsumexp over aliases (Eq. 15-16); 'code': mean log-prob.",
    )

    # The paper wins over the released code here (tests/train/test_tips_potential_scope.py): Eq. 15-16 (tips.txt
    # l. 685-689) define Phi(s) = log sum_m p_teach(A^(m) | s), the probability of the answer A itself, and App. H's
    # pseudocode (tips.txt l. 933-936) scores ``teacher(context + a)[-len(a):]``, the answer's tokens only. The
    # released code scores ``<answer>a</answer>`` (tips.md §8 item 3): then a policy that opens every turn with
    # ``<think>`` gives ``<answer>`` a low probability and Phi mostly measures that habit (72% of Phi(S_0) on the
    # pinned step). Where the protocol wraps the answer in a tag, the tag is forced into the context
    # before the answer is scored (ours: the paper's A follows the state directly, our protocols need the tag).
    potential_scope: Literal["answer_only", "full"] = Field(
        "answer_only",
        description="Which tokens Phi scores: 'answer_only' (the paper, Eq. 15-16 and App. H: the answer's own "
        "tokens, the protocol's answer tag forced into the context) or 'full' (the released code: the rendered "
        "answer, tags included). Logged as tips/answer_only.",
    )

    @property
    def reduce(self) -> Literal["sum", "mean"]:
        """How one alias's token log-probs are pooled (:func:`tips_potential`)."""
        return "sum" if self.potential == "paper" else "mean"

    def teacher_refresh_due(self, updates_done: int) -> bool:
        """Whether the teacher becomes a copy of the policy after the ``updates_done``-th update
        (:func:`tips_teacher_refresh_due` with :attr:`refresh_every`)."""
        return tips_teacher_refresh_due(updates_done, self.refresh_every)

    def potential_of(self, answer_logprobs: Sequence[Sequence[float]]) -> float:
        """Phi(S) of one state under these settings (:func:`tips_potential` with :attr:`reduce`), from the
        teacher's log-probs of each alias's answer tokens."""
        return tips_potential(answer_logprobs, reduce=self.reduce)


def tips_step_rewards(
    batch: EpisodeBatch,
    *,
    alpha: float,
    no_tool_shaping: str = "paper",
    terminal_potential: str = "zero",
) -> list[list[float]]:
    """TIPS turn rewards per step: turn k's on the step that ends it, the final reward on the last step.

    ``alpha [Phi(S_k) - Phi(S_{k-1})]`` for k = 1..M, then the outcome minus ``alpha Phi(S_M)`` (Eqs. 17-20).
    The batch's ``potentials`` signal holds episode j's ``Phi(S_0), ..., Phi(S_M)`` at index j.
    Assign the result to ``batch.step_rewards``; GAE then reads it off the steps' last tokens and carl-segment
    adds it to each segment's TD error.
    """
    potentials = batch.per_episode("potentials", "tips")
    out = []
    for j, (ep, phi) in enumerate(zip(batch.episodes, potentials, strict=True)):
        ends = ep.tool_turn_ends()
        if phi is None:
            raise ValueError(f"episode {j}: tips needs the teacher potentials Phi(S_0..S_M)")
        if len(phi) != len(ends) + 1:
            raise ValueError(f"episode {j}: {len(phi)} potentials for {len(ends)} tool turns (needs M + 1)")
        turn = tips_turn_rewards(
            list(phi),
            outcome_part(ep),
            alpha=alpha,
            no_tool_shaping=no_tool_shaping,  # type: ignore[arg-type]
            terminal_potential=terminal_potential,  # type: ignore[arg-type]
        )
        batch.last_step(j, "tips")
        rewards = [s.env_reward for s in ep.steps]
        for step, r in zip(ends, turn[:-1], strict=True):
            rewards[step] += r
        rewards[-1] += turn[-1]
        out.append(rewards)
    return out


def shape(batch: EpisodeBatch, settings: TipsSettings) -> list[list[float]]:
    return tips_step_rewards(
        batch,
        alpha=batch.signal("alpha", "tips"),
        no_tool_shaping=settings.no_tool_shaping,
        terminal_potential=settings.terminal_potential,
    )


def tips_stats(potentials: list[list[float]], alpha: float) -> dict[str, float]:
    """The scale of a batch's TIPS potentials, logged every step (tips.md §9.1 logging, a subset).

    ``potentials[j]`` is ``[Phi(S_0), ..., Phi(S_M)]`` of trajectory j. Summed answer log-probs are tens of nats
    on a small model, so these show whether the shaping (alpha |dPhi|, the paper's target ~0.2) or the terminal
    correction (-alpha Phi(S_M), added to the outcome reward of the final turn) dominates the outcome reward.
    ``mean_abs_dphi`` is over every tool turn (0.0 with ``dphi_count`` 0 when no episode called a tool).
    """
    phi_0 = [p[0] for p in potentials]
    phi_last = [p[-1] for p in potentials]
    deltas = [abs(p[k] - p[k - 1]) for p in potentials for k in range(1, len(p))]
    mean_abs = math.fsum(deltas) / len(deltas) if deltas else 0.0
    n = max(len(potentials), 1)
    return {
        "tips/phi_0": math.fsum(phi_0) / n,
        "tips/phi_last": math.fsum(phi_last) / n,
        "tips/mean_abs_dphi": mean_abs,
        "tips/dphi_count": float(len(deltas)),
        "tips/mean_abs_shaping": alpha * mean_abs,
        "tips/terminal_correction": -alpha * math.fsum(phi_last) / n,
    }


def stats(batch: EpisodeBatch) -> dict[str, float]:
    """:func:`tips_stats` of the batch's potentials and alpha (the native trainer logs them every step)."""
    potentials = [list(p) for p in batch.per_episode("potentials", "tips")]
    return tips_stats(potentials, batch.signal("alpha", "tips"))


#: the key of the alpha a batch_target run carries from batch to batch, in a trainer's saved state
ALPHA_STATE = "tips_alpha"


def batch_signals(
    batch: EpisodeBatch, settings: TipsSettings, state: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """The batch's alpha (:func:`tips_step_alpha`, from the batch's ``potentials`` and the alpha ``state`` carried
    from the previous batch), the state to carry to the next, and the potentials' scale (verl's metrics)."""
    potentials = batch.per_episode("potentials", "tips")
    deltas: list[float] = []
    phi0: list[float] = []
    for phi in potentials:
        phi0.append(phi[0])
        deltas.extend(phi[k] - phi[k - 1] for k in range(1, len(phi)))
    alpha = tips_step_alpha(
        potentials,
        mode=settings.alpha_mode,
        alpha=settings.alpha,
        target_mean_abs=settings.target_mean_abs,
        previous=state.get(ALPHA_STATE),
    )
    stats = {
        "tips_alpha": float(alpha),
        "tips_phi0_mean": sum(phi0) / len(phi0) if phi0 else 0.0,
        "tips_dphi_abs_mean": sum(abs(d) for d in deltas) / len(deltas) if deltas else 0.0,
    }
    return {ALPHA: float(alpha)}, {ALPHA_STATE: float(alpha)}, stats


POTENTIALS = register_signal(
    "potentials", "per episode, the teacher's potentials Phi(S_0), ..., Phi(S_M) at each tool turn's state"
)
ALPHA = register_signal("alpha", "the shaping scale alpha of the batch (one float)")


class TipsVerlSettings(TipsSettings):
    """verl's ``agentcredit.tips``: the shaping settings of the native ``algorithm.tips`` (:class:`TipsSettings`:
    alpha, its per-batch rule, the two edge-case options and the teacher's refresh interval), plus how the teacher
    scores the potential and where it runs (:mod:`agentcredit.integrations.verl.teacher`). verl's
    ``config/tips.yaml`` sets the Search-R1 run's values (batch_target alpha with the paper's 0.2 target)."""

    answer_template: str = Field(
        "<answer>{answer}</answer>",
        description="continuation scored at each boundary (code: tags, no spaces).",
    )
    max_aliases: int = Field(
        16, ge=1, description="cap on de-duplicated gold aliases per question (tips.md §8.11)."
    )
    teacher_replicas: int = Field(
        1,
        ge=1,
        description=(
            "refresh_every > 1: inference replicas of the lagged teacher (each with the rollout's parallelism, on "
            "GPUs of their own outside the trainer's pool); refresh_every = 1 scores on the rollout server instead."
        ),
    )


# ------------------------------------------------------------------ the teacher potentials (the signals)
#: the key of Phi's split in the signals' ``details``
POTENTIAL_SPLIT = "potential_split"


def answer_token_span(
    encode: Callable[[str], list[int]], rendered: str, answer: str
) -> tuple[list[int], int, int]:
    """``rendered`` (an answer in the protocol's format, e.g. ``<answer>A</answer>``) tokenised as the teacher
    scores it, and the span ``[start, end)`` of its tokens that belong to the answer A; the rest are format tokens.

    The tokens are those of the whole string (as today's potential scores them). A token counts as format when it
    is in the longest common prefix with the text before A tokenised alone, or the longest common suffix with the
    text after it; a token that merges format and answer characters counts as answer.
    """
    ids = encode(rendered)
    if not ids:
        raise ValueError(f"the rendered answer {rendered!r} has no tokens")
    at = rendered.find(answer) if answer else -1
    if at < 0:  # the protocol does not show the answer verbatim: every token is the answer's
        return ids, 0, len(ids)
    before, after = encode(rendered[:at]), encode(rendered[at + len(answer) :])
    start = 0
    while start < min(len(ids), len(before)) and ids[start] == before[start]:
        start += 1
    end = len(ids)
    while (
        end > start
        and len(ids) - end < len(after)
        and ids[end - 1] == after[len(after) - (len(ids) - end) - 1]
    ):
        end -= 1
    return ids, start, end


@dataclass
class TipsPotentials:
    """Phi per trajectory and policy segment (:func:`tips_potential`), and its split (each alias's summed
    log-probs, averaged over aliases): ``format`` over the format tokens of the rendered answer (0.0 under
    ``answer_only``, which does not score them) and ``answer`` over the answer's own tokens."""

    potentials: list[list[float]]
    format: list[list[float]]
    answer: list[list[float]]
    scope: str


def tips_potential_terms(
    score: ContinuationScorer,
    contexts: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]],
    encode: Callable[[str], list[int]],
    render_answer: Callable[[str], str],
    *,
    reduce: str = "sum",
    scope: str = "answer_only",
) -> TipsPotentials:
    """Phi at the start state of every policy segment of every trajectory (tips.md §2.7), and its split.

    ``contexts[j][k]`` is the exact token ids policy segment k of trajectory j was generated from (the canonical
    construction [R]: for segment 0 the prompt, later the state right after an observation; the native trainer's
    :meth:`~agentcredit.credit.signals.ProviderContext.segment_contexts`), ``answers[j]`` its gold aliases and
    ``score`` the teacher's log-probs of continuations after contexts. The continuation is each de-duplicated gold
    alias rendered in the protocol's answer format (``render_answer``) and tokenised alone (``encode``). ``scope``:

    * ``"answer_only"`` (default, the paper: :class:`~agentcredit.credit.methods.tips.TipsSettings`'s
      ``potential_scope`` cites the lines): the format tokens before the answer are forced into the context and
      only the answer's own tokens are scored, as Eq. 15-16's p_teach(A | S) reads. A policy that always opens a
      turn with ``<think>`` gives ``<answer>`` a low probability right after the state, so scoring the tags would
      make Phi measure that format habit, not only what the state says about the answer (issues 31, 48);
    * ``"full"``: Phi scores every token of the rendered answer, the tags included (the released code's
      ``<answer>a</answer>``, tips.md §8 item 3).
    """
    if scope not in ("full", "answer_only"):
        raise ValueError(f"potential_scope must be 'full' or 'answer_only', got {scope!r}")
    if len(answers) != len(contexts):
        raise ValueError(f"{len(answers)} answer lists for {len(contexts)} trajectories")
    scored_contexts, conts, answer_at, owners = [], [], [], []
    for j, (states, golds) in enumerate(zip(contexts, answers, strict=True)):
        aliases = list(dict.fromkeys(g for g in golds if g))
        if not aliases:
            raise ValueError(f"trajectory {j} has no gold answer to score a TIPS potential")
        rendered = {a: answer_token_span(encode, render_answer(a), a) for a in aliases}
        for k, state in enumerate(states):
            ctx = list(state)
            for a in aliases:
                ids, start, end = rendered[a]
                if scope == "answer_only":  # the tag forced into the context, the answer scored alone
                    scored_contexts.append(ctx + ids[:start])
                    conts.append(ids[start:end])
                    answer_at.append((0, end - start))
                else:
                    scored_contexts.append(ctx)
                    conts.append(ids)
                    answer_at.append((start, end))
                owners.append((j, k))
    logprobs = score(scored_contexts, conts)
    grouped: dict[tuple[int, int], list[list[float]]] = {}
    split: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for owner, lp, (start, end) in zip(owners, logprobs, answer_at, strict=True):
        grouped.setdefault(owner, []).append(lp)
        ans = math.fsum(lp[start:end])
        split.setdefault(owner, []).append((math.fsum(lp) - ans, ans))
    out = TipsPotentials([], [], [], scope)
    for j, states in enumerate(contexts):
        keys = [(j, k) for k in range(len(states))]
        out.potentials.append([tips_potential(grouped[key], reduce=reduce) for key in keys])
        out.format.append([math.fsum(f for f, _ in split[key]) / len(split[key]) for key in keys])
        out.answer.append([math.fsum(a for _, a in split[key]) / len(split[key]) for key in keys])
    return out


class TeacherPotentials(SignalProvider):
    """TIPS's signals, ``potentials`` and ``alpha``: the teacher potentials Phi(S) at each policy segment's start
    (:func:`tips_potential_terms`), scored by a frozen copy of the policy refreshed every ``refresh_every`` updates
    (:func:`tips_teacher_refresh_due`), and the batch's shaping scale (:func:`tips_step_alpha`, tips.md §3.7).
    Phi's split goes to the signals' ``details`` (:func:`signal_stats` logs it)."""

    provides = frozenset({"potentials", "alpha"})

    def __init__(self, run: ProviderContext, settings: TipsSettings) -> None:
        super().__init__(run, settings)
        self.teacher = run.frozen_copy(run.model)
        self.alpha: float = settings.alpha

    def fill(self, signals, batch, trees, examples, *, temperature, autocast) -> None:
        t, run = self.settings, self.run
        answers = [examples[traj.tree].answers for traj in batch.trajectories]
        split = tips_potential_terms(
            lambda contexts, continuations: run.score_continuations(
                self.teacher, contexts, continuations, autocast=autocast
            ),
            run.segment_contexts(batch),
            answers,
            run.encode,
            run.render_answer,
            reduce=t.reduce,
            scope=t.potential_scope,
        )
        signals.details[POTENTIAL_SPLIT] = split
        signals["potentials"] = split.potentials
        self.alpha = tips_step_alpha(
            split.potentials,
            mode=t.alpha_mode,
            alpha=t.alpha,
            target_mean_abs=t.target_mean_abs,
            previous=self.alpha,
        )
        signals["alpha"] = self.alpha

    def after_step(self, step: int) -> None:
        if tips_teacher_refresh_due(step, self.settings.refresh_every):
            self.refresh()

    def refresh(self) -> None:
        """The teacher becomes a frozen copy of the current policy (between batches only)."""
        self.teacher.load_state_dict(self.run.model.state_dict())

    def frozen_models(self) -> list[nn.Module]:
        return [self.teacher]

    def state_dict(self) -> dict[str, Any]:  # the keys checkpoints have always had
        return {"teacher": self.teacher.state_dict(), "tips_alpha": self.alpha}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("teacher") is not None:
            self.teacher.load_state_dict(state["teacher"])
        self.alpha = state.get("tips_alpha", self.alpha)


def tips_split_metrics(split: TipsPotentials) -> dict[str, float]:
    """Phi split into the format tokens of the rendered answer and the answer's own tokens: at S_0
    (``tips/phi_0_format``, ``tips/phi_0_answer``, means over trajectories) and over every scored state
    (``tips/phi_format``, ``tips/phi_answer``); ``tips/answer_only`` is 1 when Phi scored the answer tokens alone
    (``algorithm.tips.potential_scope``), whose format part is then 0 by construction."""
    first_f = [row[0] for row in split.format if row]
    first_a = [row[0] for row in split.answer if row]
    all_f = [v for row in split.format for v in row]
    all_a = [v for row in split.answer for v in row]
    n0, n = max(len(first_f), 1), max(len(all_f), 1)
    return {
        "tips/phi_0_format": math.fsum(first_f) / n0,
        "tips/phi_0_answer": math.fsum(first_a) / n0,
        "tips/phi_format": math.fsum(all_f) / n,
        "tips/phi_answer": math.fsum(all_a) / n,
        "tips/answer_only": 1.0 if split.scope == "answer_only" else 0.0,
    }


def signal_stats(batch: Any, signals: Any) -> dict[str, float]:
    """The native trainer's per-step log of TIPS's signals: the batch's alpha and Phi's split
    (:func:`tips_split_metrics`)."""
    out: dict[str, float] = {}
    if signals["alpha"] is not None:
        out["tips/alpha"] = float(signals["alpha"])
    split = signals.details.get(POTENTIAL_SPLIT)
    if split is not None:
        out.update(tips_split_metrics(split))
    return out


METHOD = Method(
    name="tips",
    settings=TipsSettings,
    trainer_settings=(("verl", TipsVerlSettings),),
    needs=Needs(
        critic_base=True,
        signals=frozenset({"potentials", "alpha"}),
        why="under group-normalised estimators the potential-based shaping cancels (tips.md §3.9)",
    ),
    source="TIPS Eqs. 17-20, Table 10",
    shape=shape,
    stats=stats,
    signal_stats=signal_stats,
    batch_signals=batch_signals,
    modifier="shaping",
    base=CRITIC_BASELINE,
    report_settings=("algorithm.tips.potential_scope",),
    # the potential, split into format and answer tokens
    diagnostics=(
        ("tips/phi_0", "Phi(S0)"),
        ("tips/phi_0_format", "Phi(S0) format"),
        ("tips/phi_0_answer", "Phi(S0) answer"),
        ("tips/answer_only", "answer-only Phi"),
    ),
)

register_provider(TeacherPotentials)
