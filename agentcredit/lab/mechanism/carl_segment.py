"""``agentcredit probe`` kind ``carl-segment``: after the critic warm-up, does V(s_0) tell the questions the model
answers alone (Tier 2) from those it does not (Tier 1)?

carl-segment's claim (carl-segment-level-credit.txt l. 201): "V(s_0) classifies Tier 1 from Tier 2 questions with
AUC 0.93 at 7B and 0.85 at 3B" (also l. 27, Table 11 l. 665, Fig. 4 l. 672), and the selectivity it reports rests on
it ("Because V(s_0) is high on Tier 2 questions, the invoke advantage on those questions is small by construction",
l. 219). Tier 2 is "correct in at least one of five no-tool rollouts" of the model, Tier 1 "all five rollouts
produce incorrect answers" (l. 369). Secondary: the critic's explained variance at every boundary, 0.52 / 0.48 after
warm-up at 7B / 3B (l. 208, Table 13 l. 720). The probe checks this mechanism, not an outcome: no RL.

Design (pre-registered in ``studies/carl-segment-mechanism.yaml``): a start fine-tuned on scripted demonstrations
(the model must box an answer to ever be right), then carl-segment's own warm-up (:func:`agentcredit.run.
run_warmup`, head only) on warm-up questions; then, on FRESH training questions (none in the start's SFT set, none
in the warm-up, the main part none of the pilot's), per question:

* its tier from ``tier_samples`` no-tool rollouts at T = 1 (the paper's rule, l. 369);
* V(s_0) on the state PPO reads (the PPO prompt: the ``optional`` system prompt, carl-segment.md A14);
* ``optional_samples`` rollouts under that prompt: V at every boundary against the episode's return (the EV);
* ``forced_samples`` forced-tool rollouts: the tool's help or hurt per tier (the regime issue 49 asks for; a
  description, not a verdict).

Two statistics, the question the unit of resampling: ``auc_margin`` = AUC of V(s_0), Tier 2 positive, minus 0.5;
``explained_variance`` = 1 - Var(R - V) / Var(R) over all boundaries. Neither is a mean over questions, so this kind
brings its own :func:`summarise`: intervals from a bootstrap that resamples questions (for the AUC within each tier,
so every replicate has both), verdicts by :func:`agentcredit.lab.mechanism.core.decide` at Holm's levels.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentcredit.lab.mechanism.core import (
    MechanismSpec,
    Part,
    decide,
    holm,
    planned_questions,
    training_questions,
)

__all__ = [
    "CarlSegmentProbe",
    "auc_margin",
    "boundary_explained_variance",
    "bootstrap_draws",
    "bootstrap_interval",
    "open_context",
    "questions",
    "regime",
    "replicates",
    "score_question",
    "summarise",
]


class StartSft(BaseModel):
    """The start: the model fine-tuned on scripted demonstrations (``agentcredit.run.run_sft``)."""

    model_config = ConfigDict(extra="forbid")

    examples: int = Field(ge=1)
    epochs: int = Field(2, ge=1)
    lr: float = Field(5e-5, gt=0)
    tool_share: float | None = Field(None, ge=0, le=1)
    prompts: dict[str, float] | None = None


class Warmup(BaseModel):
    """carl-segment's critic warm-up (``agentcredit.train.warmup.WarmupSettings``) and its questions."""

    model_config = ConfigDict(extra="forbid")

    questions: int = Field(ge=4, description="the first training questions under ``set``")
    set: list[str] = Field(default_factory=list, description="--set overrides for the warm-up's questions")
    tier_samples: int = Field(5, ge=1)
    rollouts_per_mode: int = Field(2, ge=1)
    states: Literal["mode", "canonical"] = "canonical"
    head_epochs: int = Field(50, ge=1)
    feature_lr: float = Field(3e-4, gt=0)
    holdout_fraction: float = Field(0.2, gt=0, lt=1)


class CarlSegmentProbe(MechanismSpec):
    statistic_names: ClassVar[tuple[str, ...]] = ("auc_margin", "explained_variance")

    kind: Literal["carl-segment"] = "carl-segment"
    preset: str = "carl-segment-arith-tools"
    workdir: str = Field(
        "runs/carl-segment-mechanism",
        description="where the start and the warmed critic are kept (not committed)",
    )
    start: StartSft | None = Field(None, description="None: the model as it is")
    warmup: Warmup
    tier_samples: int = Field(
        5, ge=1, description="no-tool rollouts per question for its tier (paper: 5, l. 369)"
    )
    optional_samples: int = Field(
        2, ge=1, description="PPO-prompt rollouts per question (boundaries for the EV)"
    )
    forced_samples: int = Field(2, ge=0, description="forced-tool rollouts per question (the regime numbers)")
    bootstrap: int = Field(2000, ge=100)
    bootstrap_seed: int = 0

    @model_validator(mode="after")
    def _start_is_the_excluded_sft(self) -> CarlSegmentProbe:
        if self.start is not None and self.start.examples != self.sft_examples:
            raise ValueError(
                f"start.examples ({self.start.examples}) must equal sft_examples ({self.sft_examples}): the "
                "questions the start was fine-tuned on are the ones the probe excludes"
            )
        return self


# --- statistics (pure) -----------------------------------------------------------------------------------------


def auc_margin(records: Sequence[dict]) -> float:
    """AUC of V(s_0) with Tier 2 positive (ties count 1/2), minus 0.5: 0 at chance, 0.35 at the paper's 3B AUC.
    One record per question; NaN when one tier is empty."""
    from agentcredit.credit.metrics import auc

    return auc([r["v_s0"] for r in records], [1.0 if r["tier"] == "tier2" else 0.0 for r in records]) - 0.5


def boundary_explained_variance(records: Sequence[dict]) -> float:
    """1 - Var(R - V) / Var(R) over every boundary of every PPO-prompt episode of the records' questions (each
    boundary's target is its episode's return R, carl-segment's Monte Carlo target, l. 90)."""
    from agentcredit.credit.metrics import explained_variance

    values, returns = [], []
    for r in records:
        for episode in r["optional"]:
            values += episode["values"]
            returns += [episode["reward"]] * len(episode["values"])
    return explained_variance(values, returns)


STATISTICS: dict[str, Callable[[Sequence[dict]], float]] = {
    "auc_margin": auc_margin,
    "explained_variance": boundary_explained_variance,
}


def bootstrap_draws(strata: Sequence[str], count: int, seed: int) -> list[list[int]]:
    """``count`` resamples of the questions (indices into ``strata``), with replacement within each stratum: the
    question is the cluster, so its episodes and boundaries move together; a stratum (the tier, for the AUC) keeps
    its size, so every replicate has both tiers."""
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    ordered = [groups[k] for k in sorted(groups)]
    return [[g[rng.randrange(len(g))] for g in ordered for _ in g] for _ in range(count)]


def replicates(
    records: Sequence[dict], statistic: Callable[[Sequence[dict]], float], draws: Sequence[Sequence[int]]
) -> list[float]:
    """The statistic on each resample; NaN replicates (e.g. no return variance) are dropped."""
    out = [statistic([records[i] for i in d]) for d in draws]
    return [x for x in out if not math.isnan(x)]


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default, type 7)."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def bootstrap_interval(reps: Sequence[float], alpha: float) -> dict:
    """One-sided percentile interval at ``alpha`` of a statistic whose claim is "> 0": low = the alpha quantile,
    high = the 1 - alpha quantile (so it reads with :func:`decide` as a t interval does), the one-sided p-value
    (1 + #{rep <= 0}) / (B + 1), and the replicates' SD (the bootstrap standard error)."""
    if len(reps) < 2:
        raise ValueError("bootstrap_interval: fewer than 2 replicates")
    s = sorted(reps)
    mean = math.fsum(s) / len(s)
    return {
        "low": _quantile(s, alpha),
        "high": _quantile(s, 1 - alpha),
        "p_one_sided": (1 + sum(1 for x in s if x <= 0)) / (len(s) + 1),
        "se": math.sqrt(math.fsum((x - mean) ** 2 for x in s) / (len(s) - 1)),
        "replicates": len(s),
    }


def regime(records: Sequence[dict]) -> dict:
    """What the questions' regime is (issue 49), per generator tier and per model tier: counts, the Tier 2 share,
    accuracy without the tool and with it forced (per question, averaged), the tool-call rate under the PPO prompt,
    the forced-minus-no-tool gap with its standard error over questions, and the AUC margin within the group."""

    def describe(rows: list[dict]) -> dict:
        if not rows:
            return {"questions": 0}
        out: dict[str, Any] = {
            "questions": len(rows),
            "tier2_share": sum(r["tier"] == "tier2" for r in rows) / len(rows),
            "no_tool_accuracy": sum(r["no_tool_correct"] / r["no_tool_samples"] for r in rows) / len(rows),
            "optional_accuracy": sum(
                sum(e["reward"] >= 1.0 for e in r["optional"]) / len(r["optional"]) for r in rows
            )
            / len(rows),
            "optional_tool_rate": sum(
                sum(e["tool_calls"] > 0 for e in r["optional"]) / len(r["optional"]) for r in rows
            )
            / len(rows),
            "mean_v_s0": sum(r["v_s0"] for r in rows) / len(rows),
            # within one generator tier, whether V(s_0) follows the model's own competence beyond the question's
            # form (None where the rows hold one model tier only)
            "auc_margin": None if len({r["tier"] for r in rows}) < 2 else auc_margin(rows),
        }
        forced = [r for r in rows if r.get("forced_samples")]
        if forced:
            gaps = [
                r["forced_correct"] / r["forced_samples"] - r["no_tool_correct"] / r["no_tool_samples"]
                for r in forced
            ]
            mean = sum(gaps) / len(gaps)
            out["forced_accuracy"] = sum(r["forced_correct"] / r["forced_samples"] for r in forced) / len(
                forced
            )
            out["forced_tool_rate"] = sum(r["forced_tool_calls"] / r["forced_samples"] for r in forced) / len(
                forced
            )
            out["tool_gap"] = mean  # > 0: the tool helps; < 0: it hurts
            out["tool_gap_se"] = (
                math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1) / len(gaps))
                if len(gaps) > 1
                else None
            )
        return out

    out = {"all": describe(list(records))}
    for key in ("tier2", "tier1"):
        out[key] = describe([r for r in records if r["tier"] == key])
    for source in sorted({r["source_tier"] for r in records}):
        out[f"generator/{source}"] = describe([r for r in records if r["source_tier"] == source])
    return out


def summarise(spec: CarlSegmentProbe, records: Sequence[dict], part: str) -> dict:
    """Pilot: each statistic's bootstrap SE and the questions it plans (the SE times sqrt(n) as the SD per question,
    through :func:`planned_questions`: its upper 80% bound, Bonferroni's first step). Main: one-sided bootstrap
    intervals at Holm's levels and their verdicts (:func:`decide`). Both: the regime (:func:`regime`)."""
    records = sorted(records, key=lambda r: r["question"])
    n = len(records)
    out: dict[str, Any] = {"part": part, "questions": n, "records": n, "regime": regime(records)}
    tiers = [r["tier"] for r in records]
    draws = {
        "auc_margin": bootstrap_draws(tiers, spec.bootstrap, spec.bootstrap_seed),
        "explained_variance": bootstrap_draws(["all"] * n, spec.bootstrap, spec.bootstrap_seed + 1),
    }
    reps = {s.name: replicates(records, STATISTICS[s.name], draws[s.name]) for s in spec.statistics}
    point = {s.name: STATISTICS[s.name](records) for s in spec.statistics}
    if part == "pilot":
        out["planning"] = {}
        for s in spec.statistics:
            iv = bootstrap_interval(reps[s.name], spec.alpha)
            sd = iv["se"] * math.sqrt(n)
            entry = {"n": n, "mean": point[s.name], "se": iv["se"], "sd": sd}
            if sd > 0:
                q, sd_up = planned_questions(s.effect, sd, n, spec.alpha / len(spec.statistics), spec.power)
                entry |= {"sd_upper_80": sd_up, "questions": q}
            else:  # every resample gave the same value (e.g. tiers separated perfectly): no spread to plan with
                entry |= {"sd_upper_80": 0.0, "questions": None}
            out["planning"][s.name] = entry
        return out
    p = {s.name: bootstrap_interval(reps[s.name], spec.alpha)["p_one_sided"] for s in spec.statistics}
    levels = holm(p, spec.alpha)
    out["statistics"] = {}
    for s in spec.statistics:
        iv = bootstrap_interval(reps[s.name], levels[s.name])
        result = decide(iv["low"], iv["high"], s)
        entry = {"n": n, "mean": point[s.name], **iv, "alpha": levels[s.name], "verdict": result}
        if result == "underpowered" and iv["se"] > 0:
            entry["questions_to_decide"] = planned_questions(
                s.effect, iv["se"] * math.sqrt(n), n, levels[s.name], spec.power
            )[0]
        out["statistics"][s.name] = entry
    return out


# --- the start, the warm-up and the rollouts -------------------------------------------------------------------


def _warmup_config(spec: CarlSegmentProbe, model_name: str | None = None) -> Any:
    return spec.config([*spec.warmup.set, *([f"model.name={model_name}"] if model_name else [])])


def questions(spec: CarlSegmentProbe, part: Part) -> list[Any]:
    """The part's training questions: none of the start's SFT set, none of the warm-up's (by question text), the
    main part none of the pilot's."""
    from agentcredit.tasks import load_examples

    warm = {
        e.question for e in load_examples(_warmup_config(spec), split="train", limit=spec.warmup.questions)
    }
    return training_questions(spec, part, keep=lambda e: e.question not in warm)


class _Environments:
    """The three prompt modes' environments, closed together (``run_parts`` closes ``ctx["env"]``)."""

    def __init__(self, config: Any):
        from agentcredit.environment import build_environment
        from agentcredit.train.warmup import _with_prompt

        self.optional = build_environment(config)
        self.no_tool = build_environment(_with_prompt(config, "no_tool"))
        self.forced = build_environment(_with_prompt(config, "forced"))

    def close(self) -> None:
        for env in (self.optional, self.no_tool, self.forced):
            env.close()


def open_context(spec: CarlSegmentProbe) -> dict:
    """The start (fine-tuned once into ``workdir/sft-model``) and its warmed critic (``workdir/critic``: the
    warm-up's model, ``value_head.pt`` and ``warmup_summary.json``), built when missing."""
    import torch

    from agentcredit.models.heads import BoundaryValueHead
    from agentcredit.models.loading import load_base_model
    from agentcredit.run import run_sft, run_warmup
    from agentcredit.train.warmup import SUMMARY, WarmupSettings

    work = Path(spec.workdir)
    start_name = spec.model
    if spec.start is not None:
        sft_dir = work / "sft-model"
        if not (sft_dir / "sft_summary.json").is_file():
            s = spec.start
            run_sft(
                spec.config([*spec.sft_set, f"model.name={spec.model}"]),
                sft_dir,
                examples=s.examples,
                epochs=s.epochs,
                lr=s.lr,
                tool_share=s.tool_share,
                prompts=s.prompts,
            )
        start_name = str(sft_dir)
    critic = work / "critic"
    if not (critic / SUMMARY).is_file():
        w = spec.warmup
        config = _warmup_config(spec, start_name)
        run_warmup(
            config,
            critic,
            questions=w.questions,
            settings=WarmupSettings(
                tier_samples=w.tier_samples,
                rollouts_per_mode=w.rollouts_per_mode,
                states=w.states,
                head_epochs=w.head_epochs,
                feature_lr=w.feature_lr,
                holdout_fraction=w.holdout_fraction,
                steps=0,
                seed=config.train.seed,
            ),
        )
    config = spec.config([f"model.name={critic}"])
    model, tokenizer = load_base_model(str(critic), config.model.dtype, seed=config.train.seed)
    model.eval()
    head = BoundaryValueHead(model.config.hidden_size)
    head.load_state_dict(torch.load(critic / "value_head.pt", map_location=model.device))
    head.to(model.device)
    head.eval()
    return {
        "env": _Environments(config),
        "model": model,
        "tokenizer": tokenizer,
        "head": head,
        "config": config,
    }


def _rollouts(ctx: dict, env: Any, example: Any, samples: int, mode: str) -> list[Any]:
    from agentcredit.rollout.infra import raise_on_infra_failures
    from agentcredit.rollout.run import run_episodes
    from agentcredit.tasks.example import stable_int

    r = ctx["config"].rollout
    trees = run_episodes(
        ctx["model"],
        ctx["tokenizer"],
        env,
        [example],
        samples=samples,
        temperature=r.temperature,
        top_p=r.top_p,
        max_new_tokens=r.max_new_tokens,
        max_episode_tokens=r.max_episode_tokens,
        max_turns=r.max_turns,
        max_batch=r.max_batch,
        seed=stable_int("carl-segment-probe", mode, example.id) % 2**31,
    )
    raise_on_infra_failures(trees, f"carl-segment probe ({mode})")
    return trees


def score_question(ctx: dict, spec: CarlSegmentProbe, example: Any) -> list[dict]:
    """One record per question: its tier, V(s_0) under the PPO prompt, V at every boundary of its PPO-prompt
    episodes with their returns, and its forced-tool outcomes."""
    import torch

    from agentcredit.eval.evaluate import episode_records
    from agentcredit.train.batch import build_batch, segment_spans
    from agentcredit.train.signals import values_at

    envs: _Environments = ctx["env"]
    no_tool = episode_records(_rollouts(ctx, envs.no_tool, example, spec.tier_samples, "no_tool"), [example])
    correct = sum(bool(e["correct"]) for e in no_tool)
    trees = _rollouts(ctx, envs.optional, example, spec.optional_samples, "optional")
    batch = build_batch(trees, pad_id=ctx["tokenizer"].pad_token_id or 0)
    spans = [segment_spans(batch, t) for t in batch.trajectories]
    positions: dict[int, list[int]] = {}
    for sp in spans:
        for row, first, _ in sp:
            positions.setdefault(row, []).append(first)
    with torch.no_grad():
        v = values_at(ctx["model"], ctx["head"], batch, {r: sorted(set(c)) for r, c in positions.items()})
    calls = {e_i: e["tool_calls"] for e_i, e in enumerate(episode_records(trees, [example]))}
    optional = [
        {
            "values": [float(v[(row, first)]) for row, first, _ in sp],
            "reward": float(traj.reward),
            "tool_calls": calls[i],
        }
        for i, (traj, sp) in enumerate(zip(batch.trajectories, spans, strict=True))
    ]
    record = {
        "question": example.id,
        "source_tier": example.info.get("tier"),
        "tier": "tier2" if correct >= 1 else "tier1",  # the paper's rule: 1 of 5 no-tool rollouts (l. 369)
        "no_tool_correct": correct,
        "no_tool_samples": len(no_tool),
        "v_s0": optional[0]["values"][0],  # s_0 is the PPO prompt: the same state for every episode
        "optional": optional,
    }
    if spec.forced_samples:
        forced = episode_records(
            _rollouts(ctx, envs.forced, example, spec.forced_samples, "forced"), [example]
        )
        record |= {
            "forced_correct": sum(bool(e["correct"]) for e in forced),
            "forced_samples": len(forced),
            "forced_tool_calls": sum(e["tool_calls"] > 0 for e in forced),
        }
    return [record]
