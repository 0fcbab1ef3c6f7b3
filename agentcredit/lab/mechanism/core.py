"""What every mechanism probe shares: the pre-registered study file, the questions, the power plan and the verdicts.

A mechanism probe decides whether a method's signal does, on real rollouts or teacher passes of the model, what its
paper says it does (issue 48). It is not an outcome study: no RL runs, so it fits a few CPU hours. Each probe is a
*kind* (one module beside this one, registered in ``__init__``) that supplies its questions' records; this module
holds the statistics, which are the same for every kind:

* the unit of analysis is the question (its records averaged), each statistic a one-sided one-sample t test of
  "the statistic is > 0" on the questions' values;
* the pilot part measures each statistic's SD per question and plans the main part's questions for ``power`` at
  the statistic's effect of interest, with the SD's upper 80% confidence bound (the SD of a small pilot is itself
  uncertain) and Bonferroni's first step over the statistics;
* the main part's questions are fresh (none in the start's SFT set, none in the pilot) and its verdicts are read at
  Holm's levels over the statistics: ``reproduced`` (the one-sided lower bound > 0), ``not reproduced`` (the upper
  bound is below the equivalence margin), ``effect excluded`` (the upper bound is below the effect of interest) or
  ``underpowered`` (with the questions that would decide at the observed SD).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "MechanismSpec",
    "Questions",
    "Statistic",
    "format_summary",
    "decide",
    "holm",
    "planned_questions",
    "question_values",
    "run_parts",
    "summarise",
    "training_questions",
    "verdict",
]

Part = Literal["pilot", "main"]


class Statistic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    effect: float = Field(gt=0, description="the effect of interest: the paper's, or ours with its reason")
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
    count: int = Field(ge=2, description="the first questions the kind keeps from it")


class MechanismSpec(BaseModel):
    """The fields every probe's study file has; a kind subclasses it with its own (``extra`` is forbidden)."""

    model_config = ConfigDict(extra="forbid")
    statistic_names: ClassVar[tuple[str, ...]] = ()

    kind: str = Field(description="the probe kind (agentcredit.lab.mechanism.KINDS)")
    name: str
    claim: str
    source: str = Field(description="the paper's lines the claim comes from")
    preset: str
    set: list[str] = Field(default_factory=list, description="--set overrides on the preset")
    model: str = Field("embedded", description="'embedded' or a local model directory")
    task_seed: int | None = Field(None, description="task.seed for the questions (None: the preset's)")
    sft_examples: int = Field(
        128,
        ge=0,
        description="the start's SFT set, excluded by question text (its first n training questions)",
    )
    sft_set: list[str] = Field(
        default_factory=list, description="--set overrides the start's SFT used (e.g. another task seed)"
    )
    pilot: Questions
    main: Questions
    alpha: float = Field(0.05, gt=0, lt=0.5, description="one-sided, family-wise (Holm over the statistics)")
    power: float = Field(0.8, ge=0.5, lt=1)
    statistics: list[Statistic]

    @model_validator(mode="after")
    def _known_statistics(self) -> MechanismSpec:
        unknown = [s.name for s in self.statistics if s.name not in self.statistic_names]
        if unknown or not self.statistics:
            raise ValueError(
                f"statistics: {self.kind} probes know {', '.join(self.statistic_names)}; got {unknown or 'none'}"
            )
        return self

    def config(self, extra: Sequence[str] = ()) -> Any:
        from agentcredit.config import load_config

        seed = [] if self.task_seed is None else [f"task.seed={self.task_seed}"]
        return load_config(self.preset, [*self.set, *seed, *extra])


# --- the questions ---------------------------------------------------------------------------------------------


def training_questions(
    spec: MechanismSpec, part: Part, keep: Callable[[Any], bool] = lambda e: True
) -> list[Any]:
    """The part's training questions that ``keep`` accepts. The split's generator gives different questions for
    different limits, so the exclusions are by question text: the main part takes none of the start's SFT set (the
    first ``sft_examples`` training questions under ``sft_set``, as ``agentcredit study`` draws them) nor the
    pilot's; the pilot takes none of the SFT set either (a pilot on SFT questions measures recall)."""
    from agentcredit.tasks import load_examples

    def draw(q: Questions) -> list[Any]:
        return [e for e in load_examples(spec.config(), split="train", limit=q.limit) if keep(e)]

    sft = (
        {e.question for e in load_examples(spec.config(spec.sft_set), split="train", limit=spec.sft_examples)}
        if spec.sft_examples
        else set()
    )
    pilot = [e for e in draw(spec.pilot) if e.question not in sft][: spec.pilot.count]
    if part == "pilot":
        out = pilot
    else:
        used = sft | {e.question for e in pilot}
        out = [e for e in draw(spec.main) if e.question not in used][: spec.main.count]
    count = (spec.pilot if part == "pilot" else spec.main).count
    if len(out) < count:
        raise ValueError(f"{part}: only {len(out)} training questions qualify; raise {part}.limit")
    return out


# --- statistics (pure) -----------------------------------------------------------------------------------------


def question_values(records: Sequence[dict], statistic: str) -> list[float]:
    """One value per question: the mean of its records' ``statistic`` (the question is the unit); records without
    the statistic (undefined for them, e.g. no informative turn) do not count."""
    by_q: dict[str, list[float]] = {}
    for r in records:
        if r.get(statistic) is not None and "question" in r:
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


def decide(low: float, high: float, stat: Statistic) -> str:
    """The verdict of a one-sided interval ``[low, high]`` for a statistic whose claim is "> 0" (a kind whose
    statistic is not a mean over questions, e.g. an AUC minus 0.5 with a bootstrap interval, reads it here too)."""
    if low > 0:
        return "reproduced"
    if high < stat.margin:
        return "not reproduced"
    if high < stat.effect:
        return "effect excluded"
    return "underpowered"


def verdict(values: Sequence[float], stat: Statistic, alpha: float, power: float) -> dict:
    """The statistic's one-sided interval at ``alpha`` and its verdict (see the module docstring)."""
    from scipy import stats

    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = stats.t.ppf(1 - alpha, n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    low, high = mean - half, mean + half
    p = float(stats.t.sf(mean / (sd / math.sqrt(n)), n - 1)) if sd > 0 else (0.0 if mean > 0 else 1.0)
    result = decide(low, high, stat)
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


def summarise(spec: MechanismSpec, records: Sequence[dict], part: str) -> dict:
    """Pilot: each statistic's SD per question and the questions it plans. Main: the verdicts (Holm over the
    statistics' one-sided p-values)."""
    values = {s.name: question_values(records, s.name) for s in spec.statistics}
    out: dict[str, Any] = {
        "part": part,
        "questions": len({r["question"] for r in records if "question" in r}),
        "records": len(records),
    }
    if part == "pilot":
        out["planning"] = {}
        for s in spec.statistics:
            v = values[s.name]
            n = len(v)
            mean = math.fsum(v) / n
            sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1))
            q, sd_up = planned_questions(s.effect, sd, n, spec.alpha / len(spec.statistics), spec.power)
            out["planning"][s.name] = {"n": n, "mean": mean, "sd": sd, "sd_upper_80": sd_up, "questions": q}
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
    lines = [f"{summary['part']}: {summary['questions']} questions, {summary['records']} records"]
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


# --- the run ---------------------------------------------------------------------------------------------------


def load_model(spec: MechanismSpec) -> tuple[Any, Any]:
    """The probe's model in eval mode: the embedded SmolLM2 or a local directory (never a download)."""
    if spec.model == "embedded":
        from agentcredit.models.embedded import load_model as embedded

        model, tokenizer = embedded()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(spec.model).is_dir():
            raise FileNotFoundError(f"model: {spec.model} is not a local model directory")
        model = AutoModelForCausalLM.from_pretrained(spec.model)
        tokenizer = AutoTokenizer.from_pretrained(spec.model)
    model.eval()
    return model, tokenizer


def run_parts(
    spec: MechanismSpec,
    out: Path,
    *,
    part: Part,
    questions: Callable[[MechanismSpec, Part], list[Any]],
    open_context: Callable[[MechanismSpec], dict],
    score_question: Callable[[dict, MechanismSpec, Any], list[dict]],
    summarise: Callable[[MechanismSpec, Sequence[dict], str], dict] = summarise,
    log: Callable[[str], None] = print,
) -> dict:
    """Score the ``part``'s questions (appending to ``out/<part>-records.jsonl``, resuming after the questions it
    holds) and write ``out/<part>-summary.json``: the planning SDs (pilot) or the verdicts (main). A context's
    ``env``, if any, is closed at the end. A kind whose statistics are not means over questions passes its own
    ``summarise`` (same signature and keys as :func:`summarise`)."""
    out.mkdir(parents=True, exist_ok=True)
    chosen = questions(spec, part)
    path = out / f"{part}-records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    # a kind may keep records that belong to no question (PORTool's pilot: a tree sampled by the model)
    done = {r["question"] for r in records if "question" in r}
    todo = [q for q in chosen if q.id not in done]
    started, load = time.perf_counter(), os.getloadavg()[0]
    if todo:
        ctx = open_context(spec)
        try:
            for i, example in enumerate(todo):
                t0 = time.perf_counter()
                new = score_question(ctx, spec, example)
                with path.open("a") as f:
                    for r in new:
                        f.write(json.dumps(r) + "\n")
                records += new
                log(
                    f"[{part}] {len(done) + i + 1}/{len(chosen)} {example.id} {time.perf_counter() - t0:.0f} s"
                )
        finally:
            if ctx.get("env") is not None:
                ctx["env"].close()
    summary = summarise(spec, records, part)
    summary["wall_s_this_call"] = time.perf_counter() - started
    summary["load_average_before_after"] = [load, os.getloadavg()[0]]
    (out / f"{part}-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
