"""``agentcredit probe-gear``: does GEAR's signal concentrate on the turn where a failing trajectory deviates?

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

The unit is the question (its episodes averaged: they share the question and the first turn). The verdict of each
statistic comes from its one-sided test at the study's alpha (Holm over the statistics): ``reproduced`` (the
interval's lower bound > 0), ``not reproduced`` (the upper bound below the equivalence margin), ``effect excluded``
(the upper bound below the effect of interest) or ``underpowered`` (with the questions that would decide).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEVIATIONS",
    "ProbeSpec",
    "episode_statistics",
    "load_spec",
    "planned_questions",
    "question_values",
    "run_probe",
    "verdict",
]

DEVIATIONS = ("wrong_search", "early_answer")
STATISTICS = ("rkl_excess", "w_gap")


class Statistic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["rkl_excess", "w_gap"]
    effect: float = Field(
        gt=0, description="the effect of interest (the paper names none: ours, with its reason)"
    )
    effect_source: str
    margin: float = Field(gt=0, description="equivalence margin: an interval below it is 'not reproduced'")
    planning_sd: float | None = Field(
        None, gt=0, description="SD per question from the pilot (None: not yet run)"
    )
    planning_sd_source: str = ""


class Questions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(
        ge=1, description="the training split is generated with this limit (it changes the questions)"
    )
    count: int = Field(ge=2, description="the first two-hop questions taken from it")


class ProbeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    claim: str
    source: str
    preset: str = "gear-kb-multihop"
    set: list[str] = Field(default_factory=list)
    model: str = "embedded"
    task_seed: int = 0
    deviations: list[Literal["wrong_search", "early_answer"]] = list(DEVIATIONS)
    sft_examples: int = Field(
        128, ge=0, description="the SFT set excluded by question text (the start's first n)"
    )
    pilot: Questions
    main: Questions
    alpha: float = Field(0.05, gt=0, lt=0.5, description="one-sided, family-wise (Holm over the statistics)")
    power: float = Field(0.8, ge=0.5, lt=1)
    statistics: list[Statistic]


def load_spec(path: Path) -> ProbeSpec:
    data = yaml.safe_load(Path(path).read_text())
    return ProbeSpec.model_validate(data)


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


def question_values(records: Sequence[dict], statistic: str) -> list[float]:
    """One value per question: the mean of its episodes' ``statistic`` (the question is the unit)."""
    by_q: dict[str, list[float]] = {}
    for r in records:
        by_q.setdefault(r["question"], []).append(r[statistic])
    return [math.fsum(v) / len(v) for _, v in sorted(by_q.items())]


def _power(n: int, effect: float, sd: float, alpha: float) -> float:
    from scipy import stats

    df = n - 1
    crit = stats.t.ppf(1 - alpha, df)
    return float(stats.nct.sf(crit, df, effect / sd * math.sqrt(n)))


def planned_questions(
    effect: float, sd: float, pilot_n: int, alpha: float, power: float
) -> tuple[int, float]:
    """Questions for ``power`` in a one-sided one-sample t test of ``effect`` at ``alpha``, planning with the pilot
    SD's upper 80% confidence bound (its uncertainty: chi-square with ``pilot_n - 1`` df). Returns (n, that SD)."""
    from scipy import stats

    sd_up = sd * math.sqrt((pilot_n - 1) / stats.chi2.ppf(0.2, pilot_n - 1))
    # power grows with n: double until it is reached, then bisect (a few dozen t evaluations even for n ~ 1e6)
    high = 2
    while _power(high, effect, sd_up, alpha) < power:
        high *= 2
        if high > 10_000_000:
            raise ValueError(f"no n up to 1e7 gives power {power} for effect {effect} at SD {sd_up}")
    low = max(2, high // 2)
    while low < high:
        mid = (low + high) // 2
        if _power(mid, effect, sd_up, alpha) >= power:
            high = mid
        else:
            low = mid + 1
    return high, sd_up


def verdict(values: Sequence[float], stat: Statistic, alpha: float, power: float) -> dict:
    """The statistic's one-sided interval at ``alpha`` and its verdict (see the module docstring)."""
    from scipy import stats

    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = stats.t.ppf(1 - alpha, n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    low, high = mean - half, mean + half
    p = float(stats.t.sf(mean / (sd / math.sqrt(n)), n - 1)) if sd > 0 else (0.0 if mean > 0 else 1.0)
    if low > 0:
        result = "reproduced"
    elif high < stat.margin:
        result = "not reproduced"
    elif high < stat.effect:
        result = "effect excluded"
    else:
        result = "underpowered"
    out = {
        "n": n,
        "mean": mean,
        "sd": sd,
        "low": low,
        "high": high,
        "p_one_sided": p,
        "alpha": alpha,
        "verdict": result,
    }
    if result == "underpowered" and sd > 0:
        out["questions_to_decide"] = planned_questions(stat.effect, sd, n, alpha, power)[0]
    return out


def holm(pvalues: dict[str, float], alpha: float) -> dict[str, float]:
    """Each statistic's alpha under Holm's step-down procedure (the family-wise ``alpha``)."""
    order = sorted(pvalues, key=pvalues.get)
    out: dict[str, float] = {}
    stopped = (
        None  # the level at which the step-down stopped: every later statistic is tested there (not rejected)
    )
    for i, name in enumerate(order):
        level = alpha / (len(order) - i) if stopped is None else stopped
        out[name] = level
        if stopped is None and pvalues[name] > level:
            stopped = level
    return out


# --- the rollouts and teacher passes ---------------------------------------------------------------------------


def two_hop_questions(spec: ProbeSpec, part: Literal["pilot", "main"]) -> list[Any]:
    """The part's two-hop training questions. The split's generator gives different questions for different limits,
    so the exclusions are by question text: the main part takes none of the SFT set's (the first ``sft_examples``
    training questions, as ``agentcredit study`` draws them) nor the pilot's."""
    from agentcredit.tasks import load_task

    def draw(q: Questions) -> list[Any]:
        pool = load_task("kb-multihop", split="train", limit=q.limit, seed=spec.task_seed)
        return [e for e in pool if e.info.get("hops") == 2]

    if part == "pilot":
        out = draw(spec.pilot)[: spec.pilot.count]
    else:
        sft = load_task("kb-multihop", split="train", limit=spec.sft_examples, seed=spec.task_seed)
        used = {e.question for e in sft} | {e.question for e in draw(spec.pilot)[: spec.pilot.count]}
        out = [e for e in draw(spec.main) if e.question not in used][: spec.main.count]
    count = (spec.pilot if part == "pilot" else spec.main).count
    if len(out) < count:
        raise ValueError(f"{part}: only {len(out)} two-hop training questions; raise its limit")
    return out


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


def score_question(ctx: dict, example: Any, kinds: Sequence[str]) -> list[dict]:
    """The question's scripted failing episodes, scored by the student and the teacher: per-token records."""
    import torch

    from agentcredit.credit.gear import gear_details
    from agentcredit.rollout.replay import replay
    from agentcredit.train import signals
    from agentcredit.train.batch import build_batch

    env, model, tokenizer, settings = ctx["env"], ctx["model"], ctx["tokenizer"], ctx["settings"]
    out = []
    for kind in kinds:
        tree = replay(
            env.protocol, tokenizer, env.tools, example.question, _student(kind, example.info["chain"])
        )
        tree.set_reward(tree.leaves()[0], 0.0)
        batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
        student, entropy, _ = signals.score_batch(model, batch)
        teacher = signals.gear_teacher_logprobs(
            model,
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


def _context(spec: ProbeSpec) -> dict:
    from agentcredit.config import load_config
    from agentcredit.credit.methods.gear import GearSettings
    from agentcredit.environment import build_environment
    from agentcredit.models.embedded import load_model
    from agentcredit.train.sft import ReferenceTrajectories

    config = load_config(spec.preset, spec.set)
    if spec.model == "embedded":
        model, tokenizer = load_model()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(spec.model)
        tokenizer = AutoTokenizer.from_pretrained(spec.model)
    model.eval()
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


def run_probe(
    spec: ProbeSpec, out: Path, *, part: Literal["pilot", "main"], log: Callable[[str], None] = print
) -> dict:
    """Score the ``part``'s questions (appending to ``out/<part>-records.jsonl``, resuming after the questions it
    holds) and write ``out/<part>-summary.json``: the planning SDs (pilot) or the verdicts (main)."""
    import os

    out.mkdir(parents=True, exist_ok=True)
    questions = two_hop_questions(spec, part)
    path = out / f"{part}-records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    done = {r["question"] for r in records}
    todo = [q for q in questions if q.id not in done]
    started, load = time.perf_counter(), os.getloadavg()[0]
    if todo:
        ctx = _context(spec)
        try:
            for i, example in enumerate(todo):
                t0 = time.perf_counter()
                new = score_question(ctx, example, spec.deviations)
                with path.open("a") as f:
                    for r in new:
                        f.write(json.dumps(r) + "\n")
                records += new
                log(
                    f"[{part}] {len(done) + i + 1}/{len(questions)} {example.id} {time.perf_counter() - t0:.0f} s"
                )
        finally:
            ctx["env"].close()
    summary = summarise(spec, records, part)
    summary["wall_s_this_call"] = time.perf_counter() - started
    summary["load_average_before_after"] = [load, os.getloadavg()[0]]
    (out / f"{part}-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def summarise(spec: ProbeSpec, records: Sequence[dict], part: str) -> dict:
    """Pilot: each statistic's SD per question and the questions it plans. Main: the verdicts (Holm over the
    statistics' one-sided p-values)."""
    values = {s.name: question_values(records, s.name) for s in spec.statistics}
    n = len(next(iter(values.values())))
    out: dict[str, Any] = {"part": part, "questions": n, "episodes": len(records)}
    if part == "pilot":
        out["planning"] = {}
        for s in spec.statistics:
            v = values[s.name]
            mean = math.fsum(v) / n
            sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1))
            q, sd_up = planned_questions(s.effect, sd, n, spec.alpha / len(spec.statistics), spec.power)
            out["planning"][s.name] = {"mean": mean, "sd": sd, "sd_upper_80": sd_up, "questions": q}
        return out
    pvalues = {
        s.name: verdict(values[s.name], s, spec.alpha, spec.power)["p_one_sided"] for s in spec.statistics
    }
    levels = holm(pvalues, spec.alpha)
    out["statistics"] = {
        s.name: verdict(values[s.name], s, levels[s.name], spec.power) for s in spec.statistics
    }
    return out


def format_summary(summary: dict) -> str:
    lines = [f"{summary['part']}: {summary['questions']} questions, {summary['episodes']} episodes"]
    for name, v in summary.get("planning", {}).items():
        lines.append(
            f"  {name}: mean {v['mean']:.4f}, SD {v['sd']:.4f} (upper 80% {v['sd_upper_80']:.4f}) -> "
            f"{v['questions']} questions"
        )
    for name, v in summary.get("statistics", {}).items():
        lines.append(
            f"  {name}: mean {v['mean']:.4f} [{v['low']:.4f}, {v['high']:.4f}] (one-sided at {v['alpha']:.3f}, "
            f"p {v['p_one_sided']:.2g}) -> {v['verdict']}"
            + (f" ({v['questions_to_decide']} questions would decide)" if "questions_to_decide" in v else "")
        )
    return "\n".join(lines)
