"""A study's pre-arm phase: the regime, the power and the budget, measured before any arm runs.

1. **Preconditions** (``preconditions`` in the study file, each with its paper line): measured on the start policy
   with *training* questions, never held-out ones. Those of the policy (``tool_gap``, ``group_success``,
   ``metric``) right after SFT, before the critic warm-up is paid for; ``warmup_gate`` after it.
2. **Power**: per claim, the minimum detectable effect of the paired design
   (:func:`agentcredit.lab.power.paired_mde`) from the start's per-question held-out outcomes, the held-out
   size and the seeds, beside the paper's effect (a non-inferiority claim: beside its margin).
3. **Budget**: one timed training step per arm (from the start, the first seed) and the start's timed held-out
   evaluation give the planned CPU hours of the arms, or GPU hours when the steps ran on a GPU (``model.device``:
   ``auto`` picks one where torch sees it; :func:`budget_hours`). Steps timed on a CPU also get a one-GPU
   *estimate* (a range with its assumptions, :mod:`agentcredit.lab.gpu_estimate`), labelled as one.

An unmet precondition or an MDE above the effect a claim tests refuses the arms (one message with the measured
values, exit 2) unless the invocation says ``--allow-unmet-regime`` / ``--allow-underpowered``; the report then
stamps "regime not met" on every verdict. Everything measured is kept in ``preflight/preflight.json`` (a resume
reuses it) and shown in the report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcredit.lab.arms import study_config
from agentcredit.lab.common import StudyError
from agentcredit.lab.gpu_estimate import gpu_estimate_range, study_gpu_estimate
from agentcredit.lab.power import (
    arm_seeds_to_decide,
    paired_mde,
    planned_seconds,
    question_sd,
    seconds_to_decide,
    seeds_needed,
    seeds_range,
)
from agentcredit.lab.study_spec import ClaimSpec, PreconditionSpec, StudyLayout, StudySpec
from agentcredit.locks import claim

RECORD = "preflight.json"
OPS = {">=": lambda v, t: v >= t, ">": lambda v, t: v > t, "<=": lambda v, t: v <= t, "<": lambda v, t: v < t}


# ------------------------------------------------------------------------------------------------ pure parts
def holds(value: float, op: str, threshold: float) -> bool:
    """Whether a measured value meets ``value op threshold`` (a NaN never does)."""
    return isinstance(value, int | float) and math.isfinite(value) and OPS[op](value, threshold)


#: the one-sided 95% normal quantile a regime's bound uses
Z95 = 1.6448536269514722


def regime_bound(value: float, se: float | None, op: str) -> float:
    """The one-sided 95% bound of a measured regime on the side its threshold must be cleared from: value - 1.645
    se for ``>=`` / ``>``, value + 1.645 se for ``<=`` / ``<``. A regime passes when this bound does, not the point
    value (issue 49: 0.771 with se 0.061 has a lower bound of 0.671 and does not clear 0.7). A statistic measured
    without a standard error (a warm-up gate's EV or AUC) is judged on its point value; the record says so
    (``bound_kind``)."""
    if not isinstance(se, int | float) or not math.isfinite(se):
        return value
    return value - Z95 * se if op in (">=", ">") else value + Z95 * se


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error sd / sqrt(n)); se is NaN below two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    return mean, (question_sd(values) / math.sqrt(n) if n > 1 else math.nan)


def tool_gap(
    counts: dict[str, int], no_tool: dict[str, float], tool: dict[str, float], tier: str
) -> tuple[float, float, int]:
    """carl-segment's regime: on the questions of ``tier`` (Tier 2: at least one of the labelling no-tool samples
    right, §4.1; Tier 1: none), the mean over questions of P(correct | no tool) - P(correct | tool), with its
    standard error over questions and the number of questions. The rates come from fresh samples, not from the
    labelling ones (which would bias P(correct | no tool) up on Tier 2 by construction)."""
    ids = [q for q, n in counts.items() if (n >= 1) == (tier == "tier2")]
    mean, se = mean_se([no_tool[q] - tool[q] for q in ids])
    return mean, se, len(ids)


def group_success_share(successes: Sequence[bool]) -> tuple[float, float, int]:
    """Share of groups (trees) with at least one correct trajectory, its binomial standard error, and n."""
    n = len(successes)
    if n == 0:
        return math.nan, math.nan, 0
    p = sum(successes) / n
    return p, math.sqrt(p * (1 - p) / n), n


def group_breakdown(groups: Sequence[tuple[Any, int, int]]) -> dict[str, dict[str, Any]]:
    """Per part of a training set (kb-multihop's hop count, arith's tier: ``groups`` holds, per group, its part,
    its correct trajectories and its trajectories): groups, groups holding a success and their share, correct
    trajectories and their share. Parts are keyed by ``str(part)``; groups without a part are left out."""
    out: dict[str, dict[str, Any]] = {}
    for part, correct, total in groups:
        if part is None:
            continue
        row = out.setdefault(str(part), {"groups": 0, "with_success": 0, "correct": 0, "trajectories": 0})
        row["groups"] += 1
        row["with_success"] += int(correct > 0)
        row["correct"] += correct
        row["trajectories"] += total
    for row in out.values():
        row["share"] = row["with_success"] / row["groups"]
        row["accuracy"] = row["correct"] / row["trajectories"] if row["trajectories"] else math.nan
    return dict(sorted(out.items()))


_VALUE = {
    "accuracy": lambda r: float(r["correct"]),
    "em": lambda r: float(r["em"]),
    "tool_calls": lambda r: float(r["tool_calls"]),
    "tool_call_rate": lambda r: float(r["tool_calls"] > 0),
    "policy_tokens": lambda r: float(r["policy_tokens"]),
}


def in_subset(record: dict[str, Any], subset: str, tier_counts: dict[str, int], strict_at: int) -> bool:
    """Whether an episode record belongs to a metric's subset: the task's tier (easy/medium/hard), a hop count
    (hop2), carl-segment's tiers (tier1/tier2 by the paper's 1-of-n rule, ``tier2_strict`` = all ``strict_at``
    no-tool samples right)."""
    info = record.get("info", {})
    if subset in ("tier1", "tier2", "tier2_strict"):
        n = tier_counts.get(record["id"])
        if n is None:
            return False
        return {"tier1": n == 0, "tier2": n >= 1, "tier2_strict": n >= strict_at}[subset]
    if subset.startswith("hop") and subset[3:].isdigit():
        return info.get("hops") == int(subset[3:])
    return info.get("tier") == subset


def per_question_values(
    records: Sequence[dict[str, Any]],
    metric: str,
    tier_counts: dict[str, int] | None = None,
    strict_at: int = 5,
) -> list[float]:
    """A metric's value per question (the mean over a question's episodes) from ``agentcredit eval``-style
    episode records; ``metric`` is a summary key (``accuracy``, ``tier2/tool_call_rate``, ``hop3/accuracy``)."""
    subset, _, base = metric.rpartition("/")
    if base not in _VALUE:
        raise ValueError(f"no per-question value for metric {metric!r} (known: {sorted(_VALUE)})")
    by_id: dict[str, list[float]] = {}
    for r in records:
        if subset and not in_subset(r, subset, tier_counts or {}, strict_at):
            continue
        by_id.setdefault(r["id"], []).append(_VALUE[base](r))
    return [sum(v) / len(v) for v in by_id.values()]


def claim_effect(c: ClaimSpec) -> tuple[float | None, str]:
    """The effect size a claim's power is judged against and what it is: for higher/lower the paper's effect, or the
    equivalence margin when it is smaller (a verdict either way, reproduced or effect excluded, needs an interval
    narrower than the smaller of the two: the report's post-run plan reads the margin too); the margin for a
    non-inferiority claim (whose interval must clear it when the arms are equal)."""
    if c.direction in ("not_lower", "not_higher"):
        return (c.margin if c.margin > 0 else None), "margin"
    if c.direction in ("higher", "lower") and c.paper_effect is not None:
        paper = abs(c.paper_effect.value)
        if c.equivalence_margin is not None and c.equivalence_margin < paper:
            return c.equivalence_margin, "equivalence margin"
        return paper, "paper"
    return None, "none"


def claim_power(c: ClaimSpec, values: Sequence[float], seeds: int, alpha: float = 0.05) -> dict[str, Any]:
    """The power row of one claim from the start's per-question values on its held-out set, at the claim's level
    ``alpha`` (after the study's multiplicity control). A pilot's ``power.paired_sd`` is the planning SD when the
    study file gives one (it holds the question noise); with ``power.pilot_seeds`` the seeds needed are a range
    over that SD's 95% interval."""
    sd, n = question_sd(values), len(values)
    effect, kind = claim_effect(c)
    p = c.power
    row: dict[str, Any] = {
        "claim": c.name,
        "metric": c.metric,
        "questions": n,
        "sd_question": sd,
        "seeds": seeds,
        "seed_sd": p.seed_sd,
        "paired_sd": p.paired_sd,
        "pilot_seeds": p.pilot_seeds,
        "rho": p.rho,
        "alpha": alpha,
        "effect": effect,
        "effect_kind": kind,
        "effect_source": (
            c.paper_effect.source
            if (kind == "paper" and c.paper_effect)
            else f"smaller than the paper's {abs(c.paper_effect.value):g} ({c.paper_effect.source})"
            if (kind == "equivalence margin" and c.paper_effect)
            else ""
        ),
    }
    if (n < 1 and p.paired_sd is None) or seeds < 2:
        row.update(mde=None, underpowered=None, seeds_needed=None, seeds_range=None)
        return row
    plan = {"seed_sd": p.seed_sd, "rho": p.rho, "paired_sd": p.paired_sd, "alpha": alpha}
    mde = paired_mde(sd, max(n, 1), seeds, **plan)
    row["mde"] = mde
    row["underpowered"] = None if effect is None else mde > effect
    row["seeds_needed"] = None if effect is None else seeds_needed(effect, sd, max(n, 1), **plan)
    row["seeds_range"] = (
        list(seeds_range(effect, p.paired_sd, p.pilot_seeds - 1, alpha=alpha))
        if effect is not None and p.paired_sd is not None and p.pilot_seeds is not None
        else None
    )
    return row


def refusal(record: dict[str, Any]) -> str | None:
    """The one-message reason the arms may not start (unmet preconditions, underpowered claims), or None."""
    parts = []
    unmet = [p for p in record.get("preconditions", []) if p.get("met") is False]
    if unmet and not record.get("overrides", {}).get("regime"):
        shown = "; ".join(
            f"{p['name']}: measured {_num(p['value'])} (se {_num(p.get('se'))}, n={p.get('n')}, one-sided 95% "
            f"bound {_num(p.get('bound'))}), needs "
            f"{p['op']} {p['threshold']}"
            for p in unmet
        )
        parts.append(f"precondition(s) not met: {shown} (override: --allow-unmet-regime)")
    weak = [r for r in record.get("power", []) if r.get("underpowered")]
    if weak and not record.get("overrides", {}).get("power"):
        shown = "; ".join(
            f"{r['claim']}: MDE {_num(r['mde'])} > {r['effect_kind']} {_num(r['effect'])}"
            f" (seeds needed: {r['seeds_needed'] or 'more than 100'})"
            for r in weak
        )
        parts.append(f"underpowered claim(s): {shown} (override: --allow-underpowered)")
    return "; ".join(parts) or None


def _num(x: Any) -> str:
    return "–" if not isinstance(x, int | float) or not math.isfinite(x) else f"{x:.3f}"


# ------------------------------------------------------------------------------------------------ measuring
def _training_examples(cfg: Any, questions: int, sft_questions: frozenset[str] = frozenset()) -> list[Any]:
    """The first ``questions`` training questions the start's SFT never demonstrated (``sft_questions``, by text)."""
    from agentcredit.tasks import load_examples

    split = cfg.task.split
    if split != "train":
        raise ValueError(
            f"preconditions are measured on training questions; the start's task.split is {split!r}"
        )
    pool = load_examples(cfg, split="train", limit=questions + len(sft_questions))
    unseen = [e for e in pool if e.question not in sft_questions][:questions]
    if len(unseen) < questions:
        raise StudyError(
            f"preconditions need {questions} training questions the start's SFT never saw; the training split "
            f"holds {len(unseen)} (lower the precondition's questions or start.sft.examples)"
        )
    return unseen


def sft_questions(spec: StudySpec) -> frozenset[str]:
    """The question texts the start's SFT demonstrated (as the runner's SFT loads them): a precondition or a pilot
    measured on them measures recall, not the regime (issue 49), so the preflight leaves them out."""
    from agentcredit.tasks import load_examples

    s = spec.start
    cfg = study_config(s.preset, [*spec.set, *s.set, *s.sft.set])
    return frozenset(e.question for e in load_examples(cfg, limit=s.sft.examples))


def _rates(trees: Sequence[Any], examples: Sequence[Any]) -> dict[str, float]:
    out = {}
    for tree, example in zip(trees, examples, strict=True):
        outcomes = list(tree.outcomes().values())
        out[example.id] = sum(1 for r in outcomes if r >= 1.0) / max(1, len(outcomes))
    return out


_GAP_SAMPLES: dict[tuple, tuple[dict[str, int], dict[str, float], dict[str, float]]] = {}


def measure_policy(spec: StudySpec, pre: PreconditionSpec, model_dir: Path) -> dict[str, Any]:
    """Measure one policy precondition (tool_gap, group_success, metric) on ``model_dir`` with training
    questions at the training temperature; returns value, se, n and what was measured."""
    from agentcredit.environment import build_environment
    from agentcredit.models.device import config_device
    from agentcredit.models.loading import load_base_model
    from agentcredit.rollout.infra import raise_on_infra_failures
    from agentcredit.rollout.run import run_episodes
    from agentcredit.train.warmup import _with_prompt, tier_counts

    start = study_config(spec.start.preset, [*spec.set, *spec.start.set, f"model.name={model_dir}"])
    temperature = start.rollout.temperature if start.rollout.temperature > 0 else 1.0
    began = time.perf_counter()
    if pre.measure == "group_success":
        arm = next(a for a in spec.arms if a.name == pre.arm)
        cfg = study_config(
            arm.preset,
            [*spec.set, *arm.set, f"model.name={model_dir}", f"train.seed={spec.seeds[0]}"],
            arm.name,
        )
        examples = _training_examples(cfg, pre.questions, sft_questions(spec))
        from agentcredit.train.trainer import Trainer

        trainer = Trainer(cfg, examples=examples, log=False)
        try:
            per = cfg.rollout.prompts_per_step
            successes = []
            per_question: dict[str, list[Any]] = {}  # id -> [part (hops / tier), correct, trajectories]
            for i in range(0, len(examples), per):
                engine = trainer.rollouts.engine(
                    trainer.env, trainer.step, seed=spec.seeds[0] * 1_000_003 + i
                )
                batch = examples[i : i + per]
                trees = engine.run(batch, trainer.rollouts.strategy, trainer.env.reward)
                raise_on_infra_failures(trees, f"precondition {pre.name!r}")
                for tree, example in zip(trees, batch, strict=True):
                    outcomes = list(tree.outcomes().values())
                    successes.append(any(r >= 1.0 for r in outcomes))
                    part = example.info.get("hops", example.info.get("tier"))
                    per_question[example.id] = [part, sum(1 for r in outcomes if r >= 1.0), len(outcomes)]
        finally:
            trainer.close()
        value, se, n = group_success_share(successes)
        detail = {
            "groups": n,
            "trajectories_per_group": cfg.rollout.n,
            "strategy": cfg.rollout.strategy,
            "temperature": cfg.rollout.temperature,
            "task_options": dict(cfg.task.options),
            # the step-1 trajectories' accuracy and the share per hop count (kb-multihop) or tier (arith)
            "by_part": group_breakdown(list(per_question.values())),
            "per_question": per_question,
        }
    else:
        model, tokenizer = load_base_model(str(model_dir), start.model.dtype, device=config_device(start))
        examples = _training_examples(start, pre.questions, sft_questions(spec))

        def sampled(prompt: str | None, seed: int) -> list[Any]:
            env = build_environment(start if prompt is None else _with_prompt(start, prompt))
            try:
                trees = run_episodes(
                    model,
                    tokenizer,
                    env,
                    examples,
                    samples=pre.samples,
                    temperature=temperature,
                    max_new_tokens=start.rollout.max_new_tokens,
                    max_episode_tokens=start.rollout.max_episode_tokens,
                    max_turns=start.rollout.max_turns,
                    seed=seed,
                    progress=f"precondition {pre.name} ({prompt or 'own prompt'})",
                )
            finally:
                env.close()
            raise_on_infra_failures(trees, f"precondition {pre.name!r}")
            return trees

        if pre.measure == "tool_gap":
            labels = spec.tier_samples or 5
            # the Tier-1 and Tier-2 gaps of one study read the same samples: drawn once per process
            memo = (str(model_dir), pre.questions, pre.samples, labels)
            if memo not in _GAP_SAMPLES:
                _GAP_SAMPLES[memo] = (
                    tier_counts(model, tokenizer, start, examples, labels, seed=4242),
                    _rates(sampled("no_tool", 4243), examples),
                    _rates(sampled("forced", 4244), examples),
                )
            counts, no_tool, tool = _GAP_SAMPLES[memo]
            value, se, n = tool_gap(counts, no_tool, tool, pre.tier)
            ids = [q for q, c in counts.items() if (c >= 1) == (pre.tier == "tier2")]
            strict = {q: (1 if c >= labels else 0) for q, c in counts.items()}  # all labelling samples right
            strict_gap, strict_se, strict_n = tool_gap(strict, no_tool, tool, "tier2")
            detail = {
                "tier_questions": n,
                "of_questions": len(examples),
                "label_samples": labels,
                "p_correct_no_tool": mean_se([no_tool[q] for q in ids])[0],
                "p_correct_tool": mean_se([tool[q] for q in ids])[0],
                "temperature": temperature,
                # the same gap on the strict Tier 2 (every labelling sample right), for choosing a regime
                "strict_tier2_gap": strict_gap,
                "strict_tier2_se": strict_se,
                "strict_tier2_questions": strict_n,
                # per question: [labelling no-tool samples right, P(correct | no tool), P(correct | tool)]
                "per_question": {q: [counts[q], no_tool[q], tool[q]] for q in counts},
            }
        else:  # metric
            from agentcredit.eval.evaluate import episode_records

            trees = sampled(pre.prompt, 4245)
            records = episode_records(trees, examples)
            values = per_question_values(records, pre.metric)
            value, se = mean_se(values)
            n = len(values)
            detail = {"questions_in_subset": n, "prompt": pre.prompt or "own", "temperature": temperature}
        del model
    return {"value": value, "se": se, "n": n, "detail": detail, "seconds": time.perf_counter() - began}


def _pre_digest(pre: PreconditionSpec, weights: str, spec: Any) -> str:
    """What a saved measurement answers: the precondition, the weights, and every setting its rollouts read (the
    common and start settings, the measured arm's preset and settings, the first seed, the tier samples). An
    arm's ``set`` changes its questions (e.g. ``train_hop_fractions``) without changing the start's weights, so
    it must change the key, or ``--resume`` would reuse a measurement of other questions."""
    from agentcredit.lab.common import _digest

    arm = next((a for a in spec.arms if a.name == pre.arm), None)
    reads = {
        "set": spec.set,
        "start": [spec.start.preset, spec.start.set],
        "arm": [arm.preset, arm.set] if arm is not None else None,
        "seed": spec.seeds[0],
        "tier_samples": spec.tier_samples,
        # issue 49: measured on training questions the start's SFT never demonstrated (a saved measurement made
        # before then read SFT questions and is not reused)
        "questions": "unseen by SFT",
    }
    return _digest({"pre": pre.model_dump(mode="json"), "weights": weights, "reads": reads})


def _timed_step(cfg: Any) -> dict[str, Any]:
    """One RL step of an arm's run config (from its start, on the first seed), timed (model loading excluded).
    Critic-only warm-up steps are switched off for the timing, so every planned step is priced as an RL step (an
    upper bound)."""
    from agentcredit.train.trainer import Trainer

    data = cfg.model_dump()
    data["train"].update(steps=1, save_every=0, eval_every=0, critic_warmup=0)
    cfg = type(cfg).model_validate(data)
    import torch

    trainer = Trainer(cfg, log=False)
    try:
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.device)
        began = time.perf_counter()
        trainer.train(progress=False)
        seconds = time.perf_counter() - began
    finally:
        trainer.close()
    return {
        "seconds": seconds,
        "prompts": cfg.rollout.prompts_per_step,
        "n": cfg.rollout.n,
        **timed_on(trainer.device),
    }


def timed_on(device: Any) -> dict[str, Any]:
    """Where a timed step ran, for the budget's unit: nothing on the CPU (the records before issue 50 have
    nothing either), the GPU, its name and the step's peak allocation on a GPU."""
    if device.type != "cuda":
        return {}
    import torch

    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device),
        "gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 1024**3,
    }


def step_unit(timings: Sequence[dict[str, Any]]) -> str:
    """``"GPU"`` when every timed step ran on a GPU, ``"CPU"`` when none did; a mix prices nothing (ValueError):
    the preflight re-times an arm whose step ran on another kind of device than the arms will."""
    kinds = {"GPU" if str(t.get("device", "cpu")).startswith("cuda") else "CPU" for t in timings}
    if len(kinds) > 1:
        raise ValueError(
            "the timed steps ran on both a CPU and a GPU: their seconds do not add up to one budget"
        )
    return kinds.pop() if kinds else "CPU"


def budget_hours(budget: dict[str, Any]) -> tuple[str, float, float | None]:
    """``(unit, planned hours, hours to decide)`` of a preflight budget: CPU hours, or GPU hours when its steps
    were timed on a GPU (``unit``); a record written before issue 50 holds CPU hours."""
    unit = budget.get("unit", "CPU")
    key = unit.lower()
    return unit, budget[f"planned_{key}_hours"], budget.get(f"{key}_hours_to_decide")


@dataclass(frozen=True)
class StartSteps:
    """What the preflight asks of the study's runner (:class:`agentcredit.lab.study.Study`), handed in by it: the
    SFT model (trained once), the start's held-out record of a policy, the whole start (SFT, warm-up, tier labels,
    held-out metrics) and an arm's run config on a seed. The preflight never imports the runner."""

    sft: Callable[[], Path]
    heldout_record: Callable[[Path, Any], dict[str, Any]]
    build_start: Callable[[], dict[str, Any]]
    run_config: Callable[[Any, int], Any]


def measuring_line(pre: PreconditionSpec) -> str:
    """The log line a precondition's measurement starts with: a policy measure rolls out on training questions; the
    warm-up gate reads the record the critic warm-up wrote (measured there, on the warm-up's own questions)."""
    if pre.measure == "warmup_gate":
        return f"[preflight] measuring {pre.name!r}: reading the critic warm-up's gate record"
    return f"[preflight] measuring {pre.name!r} on {pre.questions} training questions"


def run_preflight(
    layout: StudyLayout,
    steps: StartSteps,
    *,
    log: Callable[[str], None] = print,
    allow_unmet: bool = False,
    allow_underpowered: bool = False,
    time_steps: bool = True,
) -> dict[str, Any]:
    """Measure the preconditions, the power and the budget (module docstring); raise StudyError to refuse the arms.

    Written to ``<study>/preflight/preflight.json`` as it goes, so a stopped preflight resumes and the report can
    show what was measured even when the arms are refused. ``allow_unmet`` is recorded here; the runner that hands
    in ``steps`` applies it to its own start and runs (:meth:`agentcredit.lab.study.Study.preflight`).
    """
    from agentcredit.lab.common import StudyError, _weights_digest, _write_json

    folder = layout.dir / "preflight"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORD
    record: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    record["overrides"] = {"regime": allow_unmet, "power": allow_underpowered}
    spec = layout.spec
    began = time.perf_counter()

    def save() -> None:
        _write_json(path, record)

    with claim(folder / ".lock") as mine:
        if not mine:
            raise StudyError(f"{folder}: another invocation is running this study's preflight")
        sft_dir = steps.sft()
        weights = _weights_digest(sft_dir)
        measured = {m["key"]: m for m in record.get("preconditions", []) if "key" in m}
        rows: list[dict[str, Any]] = []

        def measure(pre: PreconditionSpec, fn) -> None:
            key = _pre_digest(pre, weights, spec)
            m = measured.get(key)
            if m is None:
                log(measuring_line(pre))
                m = {"key": key, **fn()}
            m.update(
                name=pre.name,
                source=pre.source,
                measure=pre.measure,
                op=pre.op,
                threshold=pre.threshold,
                threshold_source=pre.threshold_source or "ours",
                bound=regime_bound(m["value"], m.get("se"), pre.op),
                bound_kind="one-sided 95%"
                if isinstance(m.get("se"), int | float) and math.isfinite(m["se"])
                else "point value (no standard error)",
            )
            m["met"] = holds(m["bound"], pre.op, pre.threshold)
            rows.append(m)
            record["preconditions"] = rows + [
                r for r in record.get("preconditions", []) if r.get("key") not in {x["key"] for x in rows}
            ]
            save()
            log(
                f"[preflight] {pre.name}: {_num(m['value'])} (se {_num(m.get('se'))}, n={m.get('n')}; "
                f"{m['bound_kind']} bound {_num(m['bound'])}) {pre.op} {pre.threshold} ({m['threshold_source']}): "
                f"{'met' if m['met'] else 'NOT MET'}  [{pre.source}]"
            )

        for pre in spec.preconditions:
            if pre.measure != "warmup_gate":
                measure(pre, lambda pre=pre: measure_policy(spec, pre, sft_dir))
        record["preconditions"] = rows
        save()
        # an unmet policy regime stops before the critic warm-up and the held-out evaluation are paid for
        if (reason := refusal({**record, "power": []})) is not None:
            raise StudyError(f"{layout.dir}: the arms do not start: {reason}; measured values in {path}")

        def power_rows() -> list[dict[str, Any]]:
            """Per claim, from the start's per-question greedy outcomes on its held-out set."""
            cache = json.loads((layout.start_dir / "heldout_start.json").read_text())
            counts = cache.get("tier_counts", {})
            rows_ = []
            for c in spec.claims:
                if c.source == "training" or c.direction == "lower_spread":
                    continue
                h = c.heldout or spec.heldout[0].name
                episodes = [
                    json.loads(line)
                    for line in (layout.start_dir / f"eval_{h}_episodes.jsonl").read_text().splitlines()
                    if line.strip()
                ]
                values = per_question_values(episodes, c.metric, counts, strict_at=spec.tier_samples or 5)
                rows_.append({"heldout": h, **claim_power(c, values, len(spec.seeds), spec.claim_alpha)})
            return rows_

        def time_arms(arms: list[Any]) -> None:
            from agentcredit.models.device import config_device

            timing = record.setdefault("timing", {})
            for arm in arms:
                here = "GPU" if config_device(steps.run_config(arm, spec.seeds[0])).type == "cuda" else "CPU"
                # a step timed on another kind of device (a preflight resumed on a GPU) is timed again here
                if arm.name not in timing or step_unit([timing[arm.name]]) != here:
                    log(f"[preflight] timing one step of {arm.name}")
                    timing[arm.name] = _timed_step(steps.run_config(arm, spec.seeds[0]))
                    save()

        warm = spec.start.warmup
        policy_only = [a for a in spec.arms if layout.arm_start(a).name == "sft-model"]
        if warm is None or warm.steps == 0:
            # the warm-up leaves the policy as it is: the power and the critic-free arms' steps are measured
            # before the warm-up is paid for
            start_cfg = study_config(spec.start.preset, [*spec.set, *spec.start.set, f"model.name={sft_dir}"])
            steps.heldout_record(sft_dir, start_cfg)
            record["power"] = power_rows()
            save()
            if time_steps:
                time_arms(policy_only)

        start = steps.build_start()
        for pre in spec.preconditions:
            if pre.measure == "warmup_gate":
                gate = start.get("warmup", {}).get("gate", {})
                measure(
                    pre,
                    lambda gate=gate, pre=pre: {
                        "value": float(gate.get(pre.metric, math.nan)),
                        "se": math.nan,
                        "n": start.get("warmup", {}).get("gate_questions"),
                        "detail": {"gate": gate, "passed": start.get("warmup", {}).get("passed")},
                        "seconds": 0.0,
                    },
                )
        record["preconditions"] = rows
        cache = json.loads((layout.start_dir / "heldout_start.json").read_text())
        power = power_rows()
        record["power"] = power
        save()
        for r in power:
            log(
                f"[preflight] power: {r['claim']} ({r['metric']}, {r['heldout']}, n={r['questions']}, "
                f"{r['seeds']} seeds): MDE {_num(r['mde'])} vs {r['effect_kind']} {_num(r['effect'])}"
                + (" -> UNDERPOWERED" if r.get("underpowered") else "")
            )

        # budget: one timed step per arm
        if time_steps:
            time_arms(spec.arms)
            timing = record["timing"]
            eval_seconds = float(cache.get("eval_seconds", math.nan))
            plan = planned_seconds(
                {a: t["seconds"] for a, t in timing.items() if a in {x.name for x in spec.arms}},
                len(spec.seeds),
                spec.steps,
                eval_seconds,
                spec.eval_every,
                {a.name: layout.critic_only_steps(a) for a in spec.arms},
            )
            needed = [r["seeds_needed"] for r in power if r.get("seeds_needed")]
            deciding = max(needed) if needed else None
            # each arm at the seeds its own claims need, not every arm at the study's largest count
            claim_of = {c.name: c for c in spec.claims}
            arm_seeds = arm_seeds_to_decide(
                [
                    (claim_of[r["claim"]].arm, claim_of[r["claim"]].baseline, r.get("seeds_needed"))
                    for r in power
                ]
            )
            unit = step_unit([t for a, t in timing.items() if a in {x.name for x in spec.arms}])
            record["budget"] = {
                "eval_seconds": eval_seconds,
                "planned_seconds": plan,
                # the records before issue 50 have no unit: CPU hours
                **({"unit": unit} if unit != "CPU" else {}),
                f"planned_{unit.lower()}_hours": plan["total"] / 3600,
                "seeds": len(spec.seeds),
                "seeds_to_decide": deciding,
                "arm_seeds_to_decide": arm_seeds,
                f"{unit.lower()}_hours_to_decide": (
                    seconds_to_decide(plan, len(spec.seeds), arm_seeds) / 3600 if arm_seeds else None
                ),
                "undecidable_claims": [
                    r["claim"] for r in power if r.get("underpowered") and not r.get("seeds_needed")
                ],
            }
            log(
                f"[preflight] planned: {budget_hours(record['budget'])[1]:.1f} {unit} hours for the arms "
                f"({len(spec.arms)} arms x {len(spec.seeds)} seeds x {spec.steps} steps; one held-out evaluation "
                f"{eval_seconds:.0f} s)"
            )
            if unit == "CPU":
                # no step ran on a GPU: a labelled one-GPU estimate beside the measured CPU hours (a preflight
                # on a GPU measures GPU hours instead)
                save()
                estimate = study_gpu_estimate(layout, record)
                record["budget"]["gpu_estimate"] = estimate
                if estimate and "low" in estimate:
                    log(
                        f"[preflight] GPU hours (estimate, not measured): {gpu_estimate_range(estimate)} on one "
                        "GPU (assumptions in preflight.json; the same preflight on a GPU measures them)"
                    )
        record["load_average"] = _load_average()
        record["seconds"] = record.get("seconds", 0.0) + time.perf_counter() - began
        record["complete"] = True
        save()
    if (reason := refusal(record)) is not None:
        raise StudyError(f"{layout.dir}: the arms do not start: {reason}; measured values in {path}")
    return record


def _load_average() -> list[float] | None:
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def read_record(study_dir: Path) -> dict[str, Any]:
    """The preflight's record of a study directory ({} before the preflight wrote one)."""
    path = study_dir / "preflight" / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}
