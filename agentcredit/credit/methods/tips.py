"""TIPS: turn-level rewards from a teacher's potential Phi, then the base estimate (Eqs. 17-20, Table 10).

A shaping method: :func:`tips_step_rewards` puts the turn rewards ``alpha [Phi(S_k) - Phi(S_{k-1})]`` (and the
outcome minus ``alpha Phi(S_M)``) on the steps; the estimate (PPO's GAE as published, or carl-segment) reads them.
The potentials and the batch's alpha are signals the trainer computes with a lagged teacher. The maths is
:func:`agentcredit.credit.tips.tips_turn_rewards`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentcredit.credit.estimators import EpisodeBatch, outcome_part
from agentcredit.credit.methods.base import Method, Needs, Settings, register_signal
from agentcredit.credit.tips import tips_turn_rewards


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
    # pinned step, issue 48). Where the protocol wraps the answer in a tag, the tag is forced into the context
    # before the answer is scored (ours: the paper's A follows the state directly, our protocols need the tag).
    potential_scope: Literal["answer_only", "full"] = Field(
        "answer_only",
        description="Which tokens Phi scores: 'answer_only' (the paper, Eq. 15-16 and App. H: the answer's own "
        "tokens, the protocol's answer tag forced into the context) or 'full' (the released code: the rendered "
        "answer, tags included). Logged as tips/answer_only.",
    )

    @property
    def reduce(self) -> Literal["sum", "mean"]:
        """How one alias's token log-probs are pooled (:func:`agentcredit.credit.tips.tips_potential`)."""
        return "sum" if self.potential == "paper" else "mean"


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


POTENTIALS = register_signal(
    "potentials", "per episode, the teacher's potentials Phi(S_0), ..., Phi(S_M) at each tool turn's state"
)
ALPHA = register_signal("alpha", "the shaping scale alpha of the batch (one float)")

METHOD = Method(
    name="tips",
    settings=TipsSettings,
    needs=Needs(
        critic_base=True,
        signals=frozenset({"potentials", "alpha"}),
        why="under group-normalised estimators the potential-based shaping cancels (tips.md §3.9)",
    ),
    source="TIPS Eqs. 17-20, Table 10",
    shape=shape,
    modifier="shaping",
    base="ppo",
    report_settings=("algorithm.tips.potential_scope",),
)
