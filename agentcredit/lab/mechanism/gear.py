"""``agentcredit probe`` kind ``gear``: does GEAR's signal concentrate on the turn where a failing trajectory deviates?

GEAR's claim (seed line 16): the divergence between the student and its ground-truth-conditioned teacher "often
spikes at the onset of a semantic deviation", and GEAR weighs the departing segment by it, so that in a failed
trajectory the deviation "receive[s] stronger penalties" (line 34; Eqs. 4-5, lines 121-129). The probe checks this
mechanism, not an outcome: no RL, only rollouts and teacher passes.

Design (pre-registered in the study file, ``studies/gear-mechanism.yaml``): kb-multihop two-hop training questions
(none used for the kb-multihop start's SFT, none used by the pilot); for each, scripted failing students that follow
the reference trajectory tau* for the first hop and then deviate on turn 1 (``wrong_search``: search an entity that
is neither hop's subject; ``early_answer``: answer before the second hop), then answer wrong. The model scores each
episode as the student and as GEAR's teacher (the preset's template and tau*), and GEAR's weights are read at A = -1
(a failing trajectory). Two paired, within-trajectory statistics:

* ``rkl_excess``: the deviating turn's share of the positive rKL mass minus its share of the policy tokens;
* ``w_gap``: mean W on the deviating turn minus mean W on the other turns.

The unit is the question (its episodes averaged: they share the question and the first turn); power, verdicts and
Holm's levels are :mod:`agentcredit.lab.mechanism.core`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentcredit.lab.mechanism.core import MechanismSpec, Part, load_model, training_questions

__all__ = ["DEVIATIONS", "GearProbe", "episode_statistics", "open_context", "questions", "score_question"]

DEVIATIONS = ("wrong_search", "early_answer")


class GearProbe(MechanismSpec):
    statistic_names: ClassVar[tuple[str, ...]] = ("rkl_excess", "w_gap")

    kind: Literal["gear"] = "gear"
    preset: str = "gear-kb-multihop"
    deviations: list[Literal["wrong_search", "early_answer"]] = Field(
        default_factory=lambda: list(DEVIATIONS)
    )


# --- statistics (pure) -----------------------------------------------------------------------------------------


def episode_statistics(
    turns: Sequence[int], rkl: Sequence[float], weights: Sequence[float], deviating: int
) -> dict:
    """``rkl_excess`` and ``w_gap`` of one episode from its policy tokens' turn index, raw rKL and W."""
    n = len(turns)
    on = [t == deviating for t in turns]
    n_dev = sum(on)
    if n_dev == 0 or n_dev == n:
        raise ValueError(f"turn {deviating} must hold some but not all of the episode's {n} policy tokens")
    positive = [max(r, 0.0) for r in rkl]
    mass = math.fsum(positive)
    share = math.fsum(p for p, o in zip(positive, on, strict=True) if o) / mass if mass > 0 else 0.0
    w_dev = math.fsum(w for w, o in zip(weights, on, strict=True) if o) / n_dev
    w_other = math.fsum(w for w, o in zip(weights, on, strict=True) if not o) / (n - n_dev)
    return {
        "rkl_share": share,
        "token_share": n_dev / n,
        "rkl_excess": share - n_dev / n,
        "w_dev": w_dev,
        "w_other": w_other,
        "w_gap": w_dev - w_other,
    }


# --- the rollouts and teacher passes ---------------------------------------------------------------------------


def questions(spec: MechanismSpec, part: Part) -> list[Any]:
    """The part's two-hop training questions (none from the start's SFT set; the main part none from the pilot)."""
    return training_questions(spec, part, keep=lambda e: e.info.get("hops") == 2)


def _student(kind: str, chain: Sequence[Sequence[str]]) -> Callable[[int, str | None], str]:
    def next_text(turn: int, observation: str | None) -> str:
        if turn == 0:  # tau*'s first turn
            return f"<think>I need information about {chain[0][0]}.</think>\n<search>{chain[0][0]}</search>"
        if kind == "wrong_search" and turn == 1:
            titles = re.findall(r"Title: ([^)]+)\)", observation or "")
            wrong = next((t for t in titles if t not in (chain[0][0], chain[1][0])), "Nothing")
            return f"<think>I need information about {wrong}.</think>\n<search>{wrong}</search>"
        return "<think>I have found the answer.</think>\n<answer>Nowhere</answer>"

    return next_text


def score_question(ctx: dict, spec: GearProbe, example: Any) -> list[dict]:
    """The question's scripted failing episodes, scored by the student and the teacher: per-token records."""
    import torch

    from agentcredit.credit import gear_details
    from agentcredit.credit.methods.gear.teacher import gear_teacher_logprobs
    from agentcredit.rollout.replay import replay
    from agentcredit.train import signals
    from agentcredit.train.batch import build_batch

    env, model, tokenizer, settings = ctx["env"], ctx["model"], ctx["tokenizer"], ctx["settings"]
    out = []
    for kind in spec.deviations:
        tree = replay(
            env.protocol, tokenizer, env.tools, example.question, _student(kind, example.info["chain"])
        )
        tree.set_reward(tree.leaves()[0], 0.0)
        batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
        student, entropy, _ = signals.score_batch(model, batch)
        teacher = gear_teacher_logprobs(
            partial(signals.logprobs_under_prompts, model),
            tokenizer,
            env.protocol,
            batch,
            [tree],
            {0: example},
            settings.template,
            references={0: ctx["references"](example)} if settings.reference == "trajectory" else None,
        )
        turns, s, t, h = [], [], [], []
        for k, (row, first, last) in enumerate(signals.segment_spans(batch, batch.trajectories[0])):
            cols = [c for c in range(first, last + 1) if bool(batch.policy_mask[row, c])]
            turns += [k] * len(cols)
            s += [float(student[row, c]) for c in cols]
            t += [float(teacher[row, c]) for c in cols]
            h += [float(entropy[row, c]) for c in cols]
        starts = torch.tensor([i > 0 and turns[i] != turns[i - 1] for i in range(len(turns))])
        details = gear_details(
            -1.0,  # a failing trajectory: GEAR's weight depends on A through its sign only
            torch.tensor(s, dtype=torch.float64),
            torch.tensor(t, dtype=torch.float64),
            torch.tensor(h, dtype=torch.float64),
            torch.ones(len(turns), dtype=torch.bool),
            lambda_kl=settings.lambda_kl,
            lambda_h=settings.lambda_h,
            alpha=settings.alpha,
            beta=settings.beta,
            normalisation=settings.normalize,
            break_at_observation=settings.break_at_observation,
            turn_head_tokens=settings.turn_head_tokens,
            turn_starts=starts,
        )
        rkl = [a - b for a, b in zip(s, t, strict=True)]
        record = {
            "question": example.id,
            "kind": kind,
            "deviating_turn": 1,
            "turns": max(turns) + 1,
            "tokens": len(turns),
            "frac_in_segments": details.frac_in_segments,
            **episode_statistics(turns, rkl, details.weights.tolist(), 1),
        }
        out.append(record)
    return out


def open_context(spec: GearProbe) -> dict:
    from agentcredit.credit.methods.gear import GearSettings
    from agentcredit.environment import build_environment
    from agentcredit.train.sft import ReferenceTrajectories

    config = spec.config()
    model, tokenizer = load_model(spec)
    env = build_environment(config)
    # the method object reads its own section (as both trainers do), so no code here names it
    parts = config.algorithm.credit_method.settings_from(config.algorithm)
    settings = next(v for v in parts.values() if isinstance(v, GearSettings))
    return {
        "env": env,
        "model": model,
        "tokenizer": tokenizer,
        "settings": settings,
        "references": ReferenceTrajectories(env, tokenizer, config.protocol.name),
    }
