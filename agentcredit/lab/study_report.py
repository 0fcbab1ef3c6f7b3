"""The report of an ``agentcredit study``: intervals over seeds, learning curves with bands, and claim verdicts.

Statistics (quantiles from scipy, through :mod:`agentcredit.lab.power`):

* per arm and metric: the mean over seeds and a 95% Student-t interval, mean +- t_{0.975, n-1} * s / sqrt(n);
* per claim: the difference arm - baseline, paired by seed: arms share a seed's questions, their order and the
  step-1 rollouts, so the mean over shared seeds of (arm - baseline) with a paired t interval (n - 1 degrees of
  freedom) is the primary interval, and the verdict is read from it. Its level is 1 - alpha / (claims) under the
  study's Bonferroni control (``multiplicity``), so every verdict of a study holds together at 1 - alpha. The 95%
  Welch interval (unequal variances), which ignores the pairing, stays as a second column.
  ``higher`` / ``lower`` claims are *reproduced* when the interval lies entirely on the claimed side of 0, *not
  reproduced* when no point of it does (it lies on the other side, touching 0 at most: two arms that both call the
  tool on every question, [0, 0], are not "underpowered", the arm is not lower), *effect excluded* when it reaches
  0 but lies wholly below the claim's ``equivalence_margin`` on the claimed side (an effect that large is ruled
  out: a true zero can end here, it cannot end "reproduced"), and *underpowered* otherwise, with the seeds that
  would decide at the observed spread.
  ``not_lower`` / ``not_higher`` (non-inferiority with a margin m) are *reproduced* when the interval lies
  entirely above -m (below +m), *not reproduced* when it lies entirely below -m (above +m), else underpowered.
  ``lower_spread`` (more stable across seeds) is Levene's test: each seed's absolute deviation from its arm's
  mean, then the ``lower`` rule on the Welch interval of those deviations (a spread has no pairing); underpowered
  with fewer than 3 seeds an arm (two deviations from their own mean are always equal).
  With one seed per arm there is no interval and every verdict is underpowered.
* a claim's value per run is the final held-out evaluation, or (``source: training``) the mean of a training
  metric over the run's steps.
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentcredit.eval.report import (
    CSS,
    RunData,
    _figure,
    _html_table,
    _img,
    _markdown_table,
    _series,
    load_run,
    phase_means,
    plot_calibration,
)
from agentcredit.lab.gpu_estimate import gpu_estimate_range, gpu_estimate_text, study_gpu_estimate
from agentcredit.lab.power import seeds_needed, seeds_range, t_quantile
from agentcredit.lab.preflight import budget_hours, per_question_values, read_record
from agentcredit.lab.study_spec import StudyLayout, StudySpec


def mean_interval(values: list[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """``(mean, low, high)``: the (1 - alpha) t interval of the mean; low = high = mean for a single value."""
    if not values:
        raise ValueError("mean_interval: no values")
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, mean, mean
    half = t_quantile(1 - alpha / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def welch_interval(a: list[float], b: list[float], alpha: float = 0.05) -> tuple[float, float, float] | None:
    """``(diff, low, high)`` for mean(a) - mean(b), the (1 - alpha) Welch interval; None with fewer than 2 values a
    side."""
    if len(a) < 2 or len(b) < 2:
        return None
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    diff = float(xa.mean() - xb.mean())
    se2 = va + vb
    if se2 == 0:
        return diff, diff, diff
    denominator = va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)
    # Welch-Satterthwaite df lies between min(n) - 1 and n_a + n_b - 2; clamp it there against under/overflow
    low_df, high_df = min(len(xa), len(xb)) - 1, len(xa) + len(xb) - 2
    df = se2**2 / denominator if denominator > 0 else high_df
    df = min(max(df, low_df), high_df) if math.isfinite(df) else high_df
    half = t_quantile(1 - alpha / 2, df) * math.sqrt(se2)
    return diff, diff - half, diff + half


def paired_interval(
    a: dict[int, float], b: dict[int, float], alpha: float = 0.05
) -> tuple[float, float, float] | None:
    """``(diff, low, high)``: the mean over the seeds both arms finished of ``a[seed] - b[seed]``, with its
    (1 - alpha) t interval; None with fewer than 2 shared seeds. Pairing removes what a seed does to both arms alike
    (which questions come, in which order), the variance that dominated the first round's Welch intervals."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    return mean_interval([a[s] - b[s] for s in seeds], alpha)


def paired_sd(a: dict[int, float], b: dict[int, float]) -> float | None:
    """SD over the shared seeds of ``a[seed] - b[seed]`` (None below 2 seeds): the spread a pilot of the compared
    arms gives a study's power plan (``power.paired_sd``)."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    return float(np.std([a[s] - b[s] for s in seeds], ddof=1))


def claim_differences_table(spec) -> tuple[list[str], list[list[str]]]:
    """Per claim: the config fields where its arm and baseline differ, split into the parts the claim is about and
    the differences it tolerates (which its verdict does not isolate). A study with any other difference does not
    load (:func:`agentcredit.lab.arms.claim_differences`)."""
    from agentcredit.lab.arms import claim_differences

    def shown(pairs: dict) -> str:
        return "; ".join(f"{k}: {a} vs {b}" for k, (a, b) in pairs.items()) or "none"

    rows = []
    for c in spec.claims:
        d = claim_differences(spec, c)
        rows.append([c.name, f"{c.arm} vs {c.baseline}", shown(d.about), shown(d.tolerated)])
    return ["claim", "arms", "in what the claim is about", "also differ (tolerated, not isolated)"], rows


def verdict(
    direction: str,
    interval: tuple[float, float, float] | None,
    margin: float = 0.0,
    equivalence: float | None = None,
) -> str:
    """'reproduced' / 'not reproduced' / 'effect excluded' / 'underpowered' for a claim on arm - baseline (module
    docstring). ``equivalence``: a higher / lower claim's equivalence margin, stated in the study file before the
    runs (``equivalence_margin``); without it a verdict cannot be 'effect excluded'."""
    if interval is None:
        return "underpowered"
    _, low, high = interval
    if direction == "higher":
        if low > 0:
            return "reproduced"
        if high <= 0:
            return "not reproduced"
        return "effect excluded" if equivalence is not None and high < equivalence else "underpowered"
    if direction in ("lower", "lower_spread"):  # lower_spread: the interval is of absolute deviations
        if high < 0:
            return "reproduced"
        if low >= 0:
            return "not reproduced"
        return "effect excluded" if equivalence is not None and low > -equivalence else "underpowered"
    if direction == "not_lower":
        return "reproduced" if low > -margin else "not reproduced" if high < -margin else "underpowered"
    if direction == "not_higher":
        return "reproduced" if high < margin else "not reproduced" if low > margin else "underpowered"
    raise ValueError(f"verdict: unknown direction {direction!r}")


def verdict_label(said: str, *, ran: bool, regime_met: bool, plan: dict[str, Any] | None = None) -> str:
    """A claim's cell in the verdict table. A claim whose two arms share no finished seed reads NOT RUN, never
    UNDERPOWERED: no interval was measured, so more seeds of the plan would not decide it unless its regime holds.
    ``plan``: the preflight's power row when the planned seeds are underpowered (its MDE and the effect)."""
    label = said.upper() if ran else "NOT RUN"
    if not regime_met:
        label += " (regime not met)"
    if plan is not None:
        label += f" ({'' if ran else 'the plan is '}underpowered: MDE {_fmt(plan['mde'])} > {_fmt(plan['effect'])})"
    return label


def decide_note(
    seeds: int,
    span: tuple[int | None, int | None, int | None] | None,
    arm_hours: float | None,
    baseline_hours: float | None,
    unit: str = "CPU",
) -> str:
    """What would decide an underpowered claim after its runs: the seeds at the observed paired spread, the range
    over that spread's 95% interval (``span``: :func:`agentcredit.lab.power.seeds_range`, None at an end: more than
    100), and the hours of both arms at that count (``*_hours``: one seed of each arm, from the preflight's plan)."""
    note = f"{seeds} seeds would decide at this spread"
    if span is not None:
        low, _, high = span
        note += f", range {low or '> 100'} to {high or '> 100'} over its 95% interval"
    if arm_hours is not None and baseline_hours is not None:
        note += f"; about {seeds * (arm_hours + baseline_hours):.1f} {unit} hours for the two arms"
    return note


def seeds_to_decide(
    direction: str, a: dict[int, float], b: dict[int, float], effect: float | None, alpha: float
) -> int | None:
    """For an underpowered paired claim: the seeds whose exact paired MDE at the observed spread of d_s reaches
    ``effect`` (the equivalence margin, or the paper's effect, or a non-inferiority margin); None when unknown."""
    sd = paired_sd(a, b)
    if sd is None or not effect or direction == "lower_spread":
        return None
    return seeds_needed(effect, 0.0, 1, paired_sd=sd, alpha=alpha)


# ------------------------------------------------------------------------------------------------ reading
def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _fmt_interval(iv: tuple[float, float, float] | None) -> str:
    if iv is None:
        return "–"
    mean, low, high = iv
    return _fmt(mean) if low == high else f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]"


def _finished(study: StudyLayout) -> dict[str, dict[int, dict[str, Any]]]:
    """arm -> seed -> done.json of the finished runs."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for arm, seed in study.runs():
        path = study.run_dir(arm.name, seed) / "done.json"
        if path.is_file():
            out.setdefault(arm.name, {})[seed] = json.loads(path.read_text())
    return out


def metric_keys(study: StudyLayout) -> list[tuple[str, str]]:
    """(key, label) rows of the tables: the eval summary names of ``agentcredit eval`` / ``compare``."""
    keys = [
        ("accuracy", "accuracy"),
        ("tool_calls", "tool calls / episode"),
        ("tool_call_rate", "tool-call rate"),
        ("policy_tokens", "policy tokens / episode"),
    ]
    examples = [e for exs in study.heldout_sets().values() for e in exs]
    tiers = sorted({e.info.get("tier") for e in examples if e.info.get("tier")}, key=_tier_order)
    hops = [f"hop{h}" for h in sorted({e.info.get("hops") for e in examples if e.info.get("hops")})]
    for tier in [*tiers, *hops, "tier1", "tier2", STRICT]:
        keys += [
            (f"{tier}/accuracy", f"accuracy, {tier}"),
            (f"{tier}/tool_call_rate", f"tool-call rate, {tier}"),
        ]
    keys += [
        ("critic/auc_v_s0", "critic AUC V(s0)"),
        ("critic/ece", "critic ECE"),
        ("critic/explained_variance", "critic EV"),
    ]
    return keys


def _tier_order(tier: str) -> int:
    order = ("easy", "medium", "hard")
    return order.index(tier) if tier in order else len(order)


def _values(finished: dict[int, dict[str, Any]], heldout: str, key: str) -> list[float]:
    return list(_values_by_seed(finished, heldout, key).values())


STRICT = "tier2_strict"  # Tier 2 by a strict rule: every no-tool sample of the start right (issue 32)


def _strict_finals(study: StudyLayout, finished: dict[str, dict[int, dict[str, Any]]]) -> None:
    """Add ``tier2_strict/<metric>`` to each finished run's final summaries, computed from its final held-out
    episodes and the start's per-question no-tool counts (the paper's rule is 1 of n; the strict one n of n)."""
    cache = study.start_dir / "heldout_start.json"
    counts = json.loads(cache.read_text()).get("tier_counts") if cache.is_file() else None
    if not counts:
        return
    at = study.spec.tier_samples
    for arm, seeds in finished.items():
        for seed, record in seeds.items():
            for h in study.spec.heldout:
                path = study.run_dir(arm, seed) / f"eval_{h.name}_episodes.jsonl"
                if not path.is_file():
                    continue
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                final = record["final"].setdefault(h.name, {})
                for base in ("accuracy", "tool_call_rate", "tool_calls"):
                    values = per_question_values(rows, f"{STRICT}/{base}", counts, strict_at=at)
                    if values:
                        final[f"{STRICT}/{base}"] = float(np.mean(values))


def _strict_start(study: StudyLayout, start: dict[str, Any]) -> None:
    """The same for the start's held-out evaluation (step 0)."""
    cache = study.start_dir / "heldout_start.json"
    counts = json.loads(cache.read_text()).get("tier_counts") if cache.is_file() else None
    if not counts:
        return
    for h in study.spec.heldout:
        path = study.start_dir / f"eval_{h.name}_episodes.jsonl"
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        metrics = start.setdefault("heldout", {}).setdefault(h.name, {})
        for base in ("accuracy", "tool_call_rate"):
            values = per_question_values(rows, f"{STRICT}/{base}", counts, strict_at=study.spec.tier_samples)
            if values:
                metrics[f"{STRICT}/{base}"] = float(np.mean(values))


def _values_by_seed(finished: dict[int, dict[str, Any]], heldout: str, key: str) -> dict[int, float]:
    """seed -> the final held-out value of ``key`` (runs without a finite value are left out)."""
    out = {}
    for seed, record in finished.items():
        value = record["final"].get(heldout, {}).get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[seed] = float(value)
    return out


def absolute_deviations(values: list[float]) -> list[float]:
    """|x - mean(x)| per seed: Levene's spread measure, compared between arms with the Welch interval."""
    mean = float(np.mean(values)) if values else 0.0
    return [abs(v - mean) for v in values]


def _training_means(runs: dict[int, RunData], key: str) -> dict[int, float]:
    """seed -> the mean of a training metric over the run's steps (runs that never logged it are left out)."""
    out = {}
    for seed, run in runs.items():
        values = [
            m[key] for m in run.metrics if isinstance(m.get(key), int | float) and math.isfinite(m[key])
        ]
        if values:
            out[seed] = float(np.mean(values))
    return out


# ------------------------------------------------------------------------------------------------ plots
def _eval_series(run: RunData, key: str) -> dict[int, float]:
    """step -> value of ``key`` in a run's metrics (a later row of the same step wins)."""
    return {int(step): value for step, value in zip(*_series(run, key), strict=True)}


def plot_curves_with_bands(
    study: StudyLayout,
    runs: dict[str, list[RunData]],
    start: dict[str, Any],
    heldout: str,
    prefix: str,
    path: Path,
) -> Path:
    """Held-out metrics over training steps: per arm the mean over seeds and its 95% t band; step 0 = start."""
    plt = _figure()
    panels = [("accuracy", "held-out accuracy"), ("tool_calls", "tool calls / episode")]
    tiers = [k for k in ("easy/tool_call_rate", "medium/tool_call_rate", "tier2/tool_call_rate")]
    panels += [(k, f"tool-call rate, {k.split('/')[0]}") for k in tiers]
    panels.append(("policy_tokens", "policy tokens / episode"))
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), constrained_layout=True)
    base = start.get("heldout", {}).get(heldout, {})
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for arm, arm_runs in runs.items():
            series = [_eval_series(r, prefix + key) for r in arm_runs]
            steps = sorted({s for ser in series for s in ser})
            if key in base:
                steps = [0, *steps]
                for ser in series:
                    ser[0] = base[key]
            xs, means, lows, highs = [], [], [], []
            for s in steps:
                vals = [ser[s] for ser in series if s in ser]
                if not vals:
                    continue
                m, lo, hi = mean_interval(vals)
                xs.append(s)
                means.append(m)
                lows.append(lo)
                highs.append(hi)
            if xs:
                line = ax.plot(xs, means, marker="o", markersize=3, label=f"{arm} (n={len(arm_runs)})")[0]
                ax.fill_between(xs, lows, highs, alpha=0.2, color=line.get_color())
        ax.set_title(label)
        ax.set_xlabel("training step (0 = shared start)")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
    fig.suptitle(f"Held-out set '{heldout}': mean over seeds with 95% t band (greedy evaluation)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_training_metric(
    runs: dict[str, list[RunData]], key: str, label: str, path: Path, *, title: str | None = None
) -> Path:
    """A training metric over steps: per arm the mean over seeds with its 95% band (runs that log it)."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for arm, arm_runs in runs.items():
        series = [_eval_series(r, key) for r in arm_runs]
        steps = sorted({s for ser in series for s in ser})
        stats = [mean_interval([ser[s] for ser in series if s in ser]) for s in steps]
        if steps:
            line = ax.plot(steps, [m for m, _, _ in stats], label=arm)[0]
            ax.fill_between(
                steps,
                [lo for _, lo, _ in stats],
                [hi for _, _, hi in stats],
                alpha=0.2,
                color=line.get_color(),
            )
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def start_seconds(summary: dict[str, Any], start_dir: Path) -> float:
    """What building the start cost: the seconds its SFT, its critic warm-up and its held-out evaluation each
    recorded (``start/heldout_start.json``). The summary's own ``seconds`` times only the process that wrote it,
    which misses every part a resumed start had already finished (a start built over several sessions read ~0 h)."""
    heldout = start_dir / "heldout_start.json"
    evaluation = json.loads(heldout.read_text()).get("eval_seconds", 0.0) if heldout.is_file() else 0.0
    parts = [summary.get(part, {}).get("seconds") for part in ("sft", "warmup")]
    if all(p is None for p in parts):  # a summary without its parts' records
        return float(summary.get("seconds", 0.0))
    return float(sum(p or 0.0 for p in parts) + evaluation)


def planning_sd_cell(row: dict[str, Any], source: str = "") -> str:
    """The SD a claim's power was planned with: a pilot's paired SD (question noise included, with its seeds) or a
    seed SD added to the start's question noise; where it came from; "point plan" when it has no pilot's df."""
    if row.get("paired_sd") is not None:
        pilot = row.get("pilot_seeds")
        what = f"paired {_fmt(row['paired_sd'])}" + (
            f" (from {pilot} seeds)" if pilot else " (point plan: no pilot seeds given)"
        )
    else:
        what = f"seed {_fmt(row.get('seed_sd'))} + question noise (point plan)"
    return what + (f"; {source}" if source else "")


def seeds_needed_cell(row: dict[str, Any]) -> str:
    """The seeds that would decide a claim at its planning SD, and the range over that SD's 95% interval when a
    pilot measured it (None at an end: more than 100)."""
    needed = row.get("seeds_needed")
    cell = str(needed) if needed else ("> 100" if row.get("underpowered") else "–")
    if needed and row.get("paired_sd") is None:
        # a seed SD is a point plan; a seed SD of 0 counts the question noise alone, so the count is a floor
        cell = (
            f">= {needed} (question noise alone: the seed spread is unknown)"
            if not row.get("seed_sd")
            else f"{needed} (point plan)"
        )
    span = row.get("seeds_range")
    if span:
        low, _, high = span  # at the SD's 95% interval's low end, the SD itself, its high end
        cell += f" (range {low or '> 100'} to {high or '> 100'} over the SD's 95% interval)"
    return cell


def power_level(spec: StudySpec, power: list[dict[str, Any]]) -> str:
    """The level each claim's power was planned at, as the record measured it (a record written before the
    multiplicity control planned every claim at the study's alpha)."""
    levels = sorted({float(r["alpha"]) for r in power if r.get("alpha") is not None}) or [spec.alpha]
    level = ", ".join(f"{a:g}" for a in levels)
    if levels == [spec.alpha] or spec.multiplicity == "none":
        return f"alpha {level} per claim"
    return f"alpha {level} per claim: {spec.multiplicity} over {len(spec.claims)} claims at family-wise {spec.alpha:g}"


def preflight_sections(
    study: StudyLayout, record: dict[str, Any], finished: dict[str, dict[int, dict[str, Any]]]
) -> list[tuple[str, str, Any]]:
    """The pre-arm phase as measured (agentcredit.lab.preflight): the regime, the power, the budget."""
    spec = study.spec
    out: list[tuple[str, str, Any]] = []
    pres = record.get("preconditions", [])
    overrides = record.get("overrides", {})
    unmet = [p for p in pres if p.get("met") is False]
    load = record.get("load_average")
    text = (
        "Measured on the start policy with training questions (never held-out ones) before any arm ran"
        + (f"; load average {load} when it finished" if load else "")
        + ". "
    )
    if unmet:
        text += f"**Regime not met** ({len(unmet)} of {len(pres)} preconditions): " + (
            (
                "the arms ran anyway (--allow-unmet-regime), so every verdict below is stamped 'regime not met'."
                if any(finished.values())
                else "the preflight went on past it (--allow-unmet-regime) and no arm has run; arms run so would "
                "have every verdict stamped 'regime not met'."
            )
            if overrides.get("regime")
            else "the study refuses to run its arms."
        )
    elif pres:
        text += "Every precondition is met."
    if not record.get("complete"):
        text += " The preflight has not finished: what is shown is what it measured so far."
    out.append(("Preflight: the regime, the power and the budget, before any arm", "text", text))
    if pres:
        rows = []
        for p in pres:
            d = p.get("detail", {})
            extra = ", ".join(
                f"{k} {_fmt(v) if isinstance(v, float) else v}"
                for k, v in d.items()
                if k not in ("gate", "per_question", "by_part", "task_options") and v is not None
            )
            if d.get("task_options"):
                extra += ", task options " + ", ".join(f"{k}={v}" for k, v in d["task_options"].items())
            if d.get("by_part"):  # group_success per hop count (kb-multihop) or tier (arith)
                extra += "; per hop / tier: " + "; ".join(
                    f"{part}: {r['with_success']}/{r['groups']} trees, {r['correct']}/{r['trajectories']} "
                    "trajectories correct"
                    for part, r in d["by_part"].items()
                )
            rows.append(
                [
                    p["name"],
                    f"{_fmt(p.get('value'))} (se {_fmt(p.get('se'))}, n={p.get('n')})"
                    + (f"; {p['bound_kind']} bound {_fmt(p['bound'])}" if p.get("bound") is not None else ""),
                    f"{p['op']} {p['threshold']} ({p.get('threshold_source') or 'ours'})",
                    "met" if p.get("met") else "**NOT MET**",
                    extra,
                    p.get("source", ""),
                ]
            )
        out.append(
            (
                "Preconditions (training questions)",
                "table",
                (
                    [
                        "precondition",
                        "measured (se, n; the bound it passes on)",
                        "needs (threshold from)",
                        "",
                        "measured how",
                        "paper line",
                    ],
                    rows,
                ),
            )
        )
    power = record.get("power", [])
    if power:
        sources = {c.name: c.power.seed_sd_source for c in spec.claims if c.power is not None}
        rows = [
            [
                r["claim"],
                f"{r['metric']} ({r['heldout']})",
                str(r["questions"]),
                _fmt(r["sd_question"]),
                str(r["seeds"]),
                planning_sd_cell(r, sources.get(r["claim"], "")),
                _fmt(r["mde"]),
                (f"{r['effect_kind']} {_fmt(r['effect'])}" if r.get("effect") is not None else "–")
                + (f" ({r['effect_source']})" if r.get("effect_source") else ""),
                "–"
                if r.get("underpowered") is None
                else ("**MDE > effect**" if r["underpowered"] else "MDE <= effect"),
                seeds_needed_cell(r),
            ]
            for r in power
        ]
        out.append(
            (
                f"Power: minimum detectable effect at 80% power ({power_level(spec, power)}, paired by seed; "
                "agentcredit.lab.power.paired_mde)",
                "table",
                (
                    ["claim", "metric (set)", "questions", "SD per question (start)", "seeds", "planning SD",
                     "MDE", "effect tested", "decidable", "seeds needed"],
                    rows,
                ),
            )
        )  # fmt: skip
    budget = record.get("budget")
    timing = record.get("timing", {})
    if budget:
        spent = {arm: sum(r.get("seconds", 0.0) for r in seeds.values()) for arm, seeds in finished.items()}
        plan = budget["planned_seconds"]
        unit, planned, to_decide = budget_hours(budget)
        names = sorted({t["device_name"] for t in timing.values() if t.get("device_name")})
        where = f"one GPU: {', '.join(names)}" if unit == "GPU" else "one thread"
        # steps timed on a GPU measure GPU hours; otherwise a labelled estimate (the record's, or, for a record
        # written before the preflight stored one, computed here from the same record and the study's files)
        estimate, computed_here = None, False
        if unit == "CPU":
            estimate = budget.get("gpu_estimate")
            if estimate is None:
                estimate, computed_here = study_gpu_estimate(study, record), True
        has_estimate = bool(estimate) and "low" in estimate
        rows = [
            [
                a.name,
                _fmt(timing.get(a.name, {}).get("seconds"), 1),
                _fmt(plan.get(a.name, math.nan) / 3600, 2),
                *(
                    [
                        "–".join(
                            _fmt(estimate[end]["planned_seconds"].get(a.name, math.nan) / 3600, 2)
                            for end in ("low", "high")
                        )
                    ]
                    if has_estimate
                    else []
                ),
                _fmt(spent.get(a.name, 0.0) / 3600, 2),
                f"{len(finished.get(a.name, {}))} of {len(spec.seeds)}",
            ]
            for a in spec.arms
        ]
        rows.append(
            [
                "total",
                "",
                _fmt(plan["total"] / 3600, 2),
                *([gpu_estimate_range(estimate)] if has_estimate else []),
                _fmt(sum(spent.values()) / 3600, 2),
                "",
            ]
        )
        text = (
            f"Planned from one timed step per arm and one timed held-out evaluation of every set "
            f"({_fmt(budget.get('eval_seconds'), 0)} s): seeds x (steps x step seconds + evaluations x evaluation "
            f"seconds) = **{planned:.1f} {unit} hours** for {len(spec.arms)} arms x "
            f"{budget['seeds']} seeds x {spec.steps} steps ({where}; an arm's critic-only warm-up steps run before "
            "its policy updates, each priced as an RL step)."
        )
        if budget.get("arm_seeds_to_decide"):
            arms_at = ", ".join(f"{a} {n}" for a, n in budget["arm_seeds_to_decide"].items())
            text += (
                f" The seeds that would decide every claim whose MDE can reach its effect, each arm at the most its "
                f"own claims need ({arms_at}; an arm in no such claim runs none): about {to_decide:.1f} {unit} "
                "hours."
            )
        elif budget.get("seeds_to_decide"):
            text += (
                f" The seeds that would decide every claim whose MDE can reach its effect: "
                f"{budget['seeds_to_decide']}, about {to_decide:.1f} {unit} hours."
            )
        if has_estimate:
            text += " " + gpu_estimate_text(estimate, computed_here)
        elif estimate and estimate.get("missing"):
            text += (
                f" GPU hours: not measured (no step ran on a GPU), and not estimated: {estimate['missing']} is "
                "missing."
            )
        if budget.get("undecidable_claims"):
            text += (
                " Not decidable with these held-out sets at any number of seeds up to 100: "
                + "; ".join(budget["undecidable_claims"])
                + "."
            )
        out.append(("Budget: planned before the arms, spent so far", "text", text))
        out.append(
            (
                "",
                "table",
                (
                    [
                        "arm",
                        "timed step (s)",
                        f"planned ({unit} h)",
                        *(["planned (GPU h, estimate, not measured)"] if has_estimate else []),
                        "spent (h)",
                        "runs finished",
                    ],
                    rows,
                ),
            )
        )
    return out


def plot_training_reward(runs: dict[str, list[RunData]], path: Path) -> Path:
    return plot_training_metric(
        runs,
        "reward/mean",
        "mean reward of the step's rollouts",
        path,
        title="Training reward (sampled rollouts), mean over seeds with 95% band",
    )


# ------------------------------------------------------------------------------------------------ report
def write_study_report(study: StudyLayout, out_dir: str | Path) -> dict[str, Path]:
    """``report.md`` (+ ``plots/``) and a self-contained ``report.html`` from the finished runs so far."""
    out_dir = Path(out_dir)
    plots = out_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    spec = study.spec
    start_path = study.start_dir / "summary.json"
    start = json.loads(start_path.read_text()) if start_path.is_file() else {}
    finished = _finished(study)
    runs = {
        arm: [load_run(study.run_dir(arm, seed)) for seed in sorted(seeds)] for arm, seeds in finished.items()
    }
    keys = metric_keys(study)
    _strict_finals(study, finished)
    if start:
        _strict_start(study, start)
    preflight = read_record(study.dir)
    unmet = [p for p in preflight.get("preconditions", []) if p.get("met") is False]
    weak = {r["claim"]: r for r in preflight.get("power", []) if r.get("underpowered")}
    # one seed of each arm as the preflight planned it, to price the seeds that would decide a claim
    budget = preflight.get("budget") or {}
    budget_unit = budget_hours(budget)[0] if budget else "CPU"
    per_seed_hours = {
        arm: seconds / budget["seeds"] / 3600
        for arm, seconds in budget.get("planned_seconds", {}).items()
        if arm != "total" and budget.get("seeds")
    }
    sections: list[tuple[str, str, Any]] = []  # (title, kind, payload): kind in text / table / image

    total_runs = len(study.runs())
    n_done = sum(len(v) for v in finished.values())
    marker = yaml.safe_load((study.dir / "study.yaml").read_text()) or {}
    seconds = [r["seconds"] for arm in finished.values() for r in arm.values()]
    intro = (
        f"{spec.description.strip()}\n\n"
        f"Study file: `{marker.get('source', '')}`; regenerate with `agentcredit study --config {marker.get('source', '')} "
        f"--out {study.dir} --resume`. Commit: {_commit()}. Runs finished: {n_done} of {total_runs} "
        f"({len(spec.arms)} arms x {len(spec.seeds)} seeds, {spec.steps} steps each, held-out evaluation every "
        f"{spec.eval_every} steps, greedy). Wall time of the finished runs: {sum(seconds) / 3600:.2f} h "
        f"(start: {start_seconds(start, study.start_dir) / 3600:.2f} h: SFT, critic warm-up and held-out evaluation as "
        f"each recorded it). Report written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
    )
    sections.append(("", "text", intro))
    if preflight:
        sections += preflight_sections(study, preflight, finished)

    # the start
    if start:
        sft = start.get("sft", {})
        text = (
            f"SFT: {sft.get('episodes')} demonstrations ({sft.get('source')}), {sft.get('epochs')} epochs, loss "
            f"{_fmt(sft.get('first_loss'))} -> {_fmt(sft.get('last_loss'))}, "
            f"{_fmt(sft.get('tool_calls_per_episode'), 2)} tool calls per demonstration."
        )
        if "warmup" in start:
            w = start["warmup"]
            gate = w.get("gate", {})
            text += (
                f" Critic warm-up: gate {'passed' if w.get('passed') else 'NOT passed'} on its held-out warm-up "
                f"questions: AUC {_fmt(gate.get('auc'))} (gate 0.70), sign accuracy {_fmt(gate.get('sign_accuracy'))} "
                f"(0.60), explained variance {_fmt(gate.get('explained_variance'))} (0.45); {w.get('seconds', 0):.0f} s."
            )
            if not w.get("passed"):
                started = "started" if n_done else "would start only"
                text += (
                    f" **The arms with a critic {started} on this FAILED gate** (start.warmup.allow_failed_gate); "
                    "the paper's warm-up continues until the gate passes, so their results are not the paper's "
                    "method."
                )
        tiers = start.get("tiers") or {}
        if tiers:
            n2 = sum(1 for t in tiers.values() if t == "tier2")
            text += (
                f" Tier labels of the held-out questions from {spec.tier_samples} no-tool samples of the start model: "
                f"{n2} Tier 2 (answerable alone), {len(tiers) - n2} Tier 1."
            )
        sections.append(("The shared start", "text", text))
        header = ["metric", *[h.name for h in spec.heldout]]
        rows = [
            [label, *[_fmt(start.get("heldout", {}).get(h.name, {}).get(key)) for h in spec.heldout]]
            for key, label in keys
            if any(key in start.get("heldout", {}).get(h.name, {}) for h in spec.heldout)
        ]
        sections.append(("Start, measured on the held-out sets", "table", (header, rows)))

    # per held-out set: mean [95% CI] per arm
    for h in spec.heldout:
        header = ["metric", "start", *[f"{a.name} (n={len(finished.get(a.name, {}))})" for a in spec.arms]]
        rows = []
        for key, label in keys:
            cells = [
                _fmt_interval(mean_interval(v))
                if (v := _values(finished.get(a.name, {}), h.name, key))
                else "–"
                for a in spec.arms
            ]
            base = start.get("heldout", {}).get(h.name, {}).get(key)
            if all(c == "–" for c in cells) and base is None:
                continue
            rows.append([label, _fmt(base), *cells])
        sections.append(
            (
                f"Held-out set '{h.name}' after {spec.steps} steps: mean [95% t interval] over seeds",
                "table",
                (header, rows),
            )
        )

    # claims
    if spec.claims:
        header = [
            "claim",
            "metric",
            "set",
            "arm",
            "baseline",
            f"arm - baseline, paired by seed [{100 * (1 - spec.claim_alpha):.4g}% t]",
            "[95% Welch]",
            "verdict",
        ]
        rows = []
        for c in spec.claims:
            if c.source == "training":
                h = "training (mean over steps)"
                a_by, b_by = (
                    _training_means(
                        dict(zip(sorted(finished.get(arm, {})), runs.get(arm, []), strict=True)), c.metric
                    )
                    for arm in (c.arm, c.baseline)
                )
            else:
                h = c.heldout or spec.heldout[0].name
                a_by = _values_by_seed(finished.get(c.arm, {}), h, c.metric)
                b_by = _values_by_seed(finished.get(c.baseline, {}), h, c.metric)
            a, b = list(a_by.values()), list(b_by.values())
            if c.direction == "lower_spread":
                # two values per arm have equal deviations (zero variance): no interval, so no verdict below 3
                enough = len(a) >= 3 and len(b) >= 3
                # at the claim's level, as every other verdict (the study's multiplicity control)
                welch = (
                    welch_interval(absolute_deviations(a), absolute_deviations(b), spec.claim_alpha)
                    if enough
                    else None
                )
                iv, paired_cell = welch, "– (a spread: Welch on absolute deviations)"
                compared = "absolute deviation from the arm's mean: "
            else:
                iv, welch, compared = paired_interval(a_by, b_by, spec.claim_alpha), welch_interval(a, b), ""
                paired_cell = f"{_fmt_interval(iv)} (n={len(set(a_by) & set(b_by))} seeds)"
            said = verdict(c.direction, iv, c.margin, c.equivalence_margin)
            if said == "underpowered":
                effect = (
                    c.equivalence_margin or (c.paper_effect.value if c.paper_effect else None) or c.margin
                )
                more = seeds_to_decide(c.direction, a_by, b_by, effect, spec.claim_alpha)
                if more is not None:
                    said += " (" + decide_note(
                        more,
                        seeds_range(effect, paired_sd(a_by, b_by), len(set(a_by) & set(b_by)) - 1,
                                    alpha=spec.claim_alpha),
                        per_seed_hours.get(c.arm), per_seed_hours.get(c.baseline), budget_unit,
                    ) + ")"  # fmt: skip
                elif effect and c.direction != "lower_spread" and paired_sd(a_by, b_by) is not None:
                    said += " (more than 100 seeds would decide at this spread)"
            rows.append(
                [
                    c.name,
                    f"{c.metric} ({c.direction.replace('_', ' ')}{f', margin {c.margin}' if c.margin else ''})",
                    h,
                    f"{c.arm}: {_fmt_interval(mean_interval(a)) if a else '–'} (n={len(a)})",
                    f"{c.baseline}: {_fmt_interval(mean_interval(b)) if b else '–'} (n={len(b)})",
                    paired_cell,
                    compared + _fmt_interval(welch),
                    verdict_label(
                        said, ran=bool(set(a_by) & set(b_by)), regime_met=not unmet, plan=weak.get(c.name)
                    ),
                ]
            )
        sections.append(("Claims", "table", (header, rows)))
        sections.append(
            (
                "What each claim's two arms differ in (resolved configs, arm vs baseline)",
                "table",
                claim_differences_table(spec),
            )
        )

    # wall time
    header = ["run", "steps", "wall time (min)", "mean s/step (rollout / signals / update)", "eval s (total)"]
    rows = []
    for arm, arm_runs in runs.items():
        for run, (seed, record) in zip(arm_runs, sorted(finished[arm].items()), strict=True):
            phases = phase_means(run).values()
            evals = sum(m.get("time/eval", 0.0) for m in run.metrics)
            rows.append(
                [
                    f"{arm} seed {seed}",
                    str(spec.steps),
                    f"{record['seconds'] / 60:.1f}",
                    " / ".join(_fmt(p, 1) for p in phases),
                    f"{evals:.0f}",
                ]
            )
    if rows:
        sections.append(("Wall time per run", "table", (header, rows)))

    failed = [
        (arm.name, seed, json.loads(path.read_text()))
        for arm, seed in study.runs()
        if (path := study.run_dir(arm.name, seed) / "failed.json").is_file()
    ]
    if failed:
        rows = [[f"{arm} seed {seed}", str(f.get("step")), f.get("error", "")] for arm, seed, f in failed]
        sections.append(
            ("Failed runs (left out of every table above)", "table", (["run", "step", "error"], rows))
        )

    # plots
    if runs and any("study/no_success_groups" in m for rs in runs.values() for r in rs for m in r.metrics):
        path = plot_training_metric(
            runs,
            "study/no_success_groups",
            "share of the step's groups without a correct trajectory",
            plots / "no_success_groups.png",
        )
        sections.append(("Groups without a success, per training step (beside the curves)", "image", path))
    if runs:
        for i, h in enumerate(spec.heldout):
            prefix = "eval/" if i == 0 else f"eval_{h.name}/"
            path = plot_curves_with_bands(study, runs, start, h.name, prefix, plots / f"curves_{h.name}.png")
            sections.append((f"Learning curves, held-out set '{h.name}'", "image", path))
        sections.append(
            ("Training reward", "image", plot_training_reward(runs, plots / "training_reward.png"))
        )
        critic_runs = [r for arm_runs in runs.values() for r in arm_runs]
        calibration = plot_calibration(critic_runs, plots / "calibration.png")
        if calibration is not None:
            sections.append(("Critic calibration (final held-out evaluation)", "image", calibration))

    return _write(out_dir, f"agentcredit study: {spec.name}", sections)


def _commit() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"


def _write(out_dir: Path, title: str, sections: list[tuple[str, str, Any]]) -> dict[str, Path]:
    md, parts = [f"# {title}"], [f"<h1>{html.escape(title)}</h1>"]
    for heading, kind, payload in sections:
        if heading:
            md.append(f"## {heading}")
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        if kind == "text":
            md.append(payload)
            parts += [f"<p>{html.escape(p)}</p>" for p in payload.split("\n\n") if p.strip()]
        elif kind == "table":
            md.append(_markdown_table(*payload))
            parts.append(_html_table(*payload))
        else:
            md.append(f"![{heading}](plots/{payload.name})")
            parts.append(_img(payload, heading))
    markdown = out_dir / "report.md"
    markdown.write_text("\n\n".join(md) + "\n")
    page = out_dir / "report.html"
    page.write_text(
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return {"markdown": markdown, "html": page, "plots": out_dir / "plots"}
