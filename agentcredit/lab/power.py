"""Power before spending: a claim's minimum detectable effect (MDE) and the CPU budget a study plans.

Pure functions (no model, no files); :mod:`agentcredit.lab.preflight` feeds them what the start measured.

The design is the study's: every arm runs the same seeds, and in one seed every arm sees the same training
questions in the same order from the same start and is evaluated on the same held-out questions. A claim's value
per seed is d_s = mean over the n held-out questions q of (arm_{s,q} - baseline_{s,q}); the report's primary
interval is the paired t interval of the d_s over the S seeds (``study_report.paired_interval``), at the level the
study's multiplicity control gives each claim (:func:`claim_alpha`).

Quantiles, the noncentral t and the chi-square come from scipy (a well-kept library, in place of the hand-kept
tables and the shifted-central-t shortcut of the second round).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import optimize, stats


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (scipy's, exact)."""
    if not df > 0:
        raise ValueError(f"t_quantile: degrees of freedom must be > 0, got {df}")
    return float(stats.t.ppf(p, df))


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t: the half-width factor of a two-sided 95% interval."""
    return t_quantile(0.975, df)


def question_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1) of the start's per-question values of a metric (0 for one value).

    For a 0/1 metric with rate p over n questions it is sqrt(p (1 - p) n / (n - 1))."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired_power(effect: float, se: float, df: float, *, alpha: float = 0.05) -> float:
    """The chance that the paired two-sided (1 - alpha) t interval lies wholly on the side of a true ``effect``
    (the verdict "reproduced"): P(T > t_{1-alpha/2, df}) for T noncentral t with ``df`` and noncentrality
    |effect| / se. Exact (scipy's noncentral t): the shifted-central-t shortcut this replaces is optimistic at
    small df (80% planned, 77% had at 2 df; issue 49)."""
    if se <= 0:
        return 1.0 if effect != 0 else alpha / 2
    critical = t_quantile(1.0 - alpha / 2, df)
    return float(stats.nct.sf(critical, df, abs(effect) / se))


def per_seed_sd(
    sd_question: float,
    n_questions: int,
    *,
    seed_sd: float = 0.0,
    rho: float = 0.0,
    paired_sd: float | None = None,
) -> float:
    """SD of one seed's paired difference d_s = mean over the n held-out questions of (arm - baseline).

    ``paired_sd``, when given, is that SD measured directly: the spread over a pilot's seeds of the compared arms'
    own d_s on the study's held-out size. It already holds the question noise, so it is used alone (adding
    2 sigma^2 / n again would count the question noise twice; issue 49). Otherwise it is composed:
    Var(d_s) = 2 sigma^2 (1 - rho) / n + seed_sd^2, with ``seed_sd`` the part of the spread that is not question
    noise (what seed s does to one arm and not the other) and rho the arms' correlation on one question."""
    if paired_sd is not None:
        if paired_sd < 0:
            raise ValueError("per_seed_sd: paired_sd must be >= 0")
        return paired_sd
    if n_questions < 1:
        raise ValueError(f"per_seed_sd: n_questions must be >= 1, got {n_questions}")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"per_seed_sd: rho must be in [0, 1], got {rho}")
    if sd_question < 0 or seed_sd < 0:
        raise ValueError("per_seed_sd: standard deviations must be >= 0")
    return math.sqrt(2.0 * sd_question**2 * (1.0 - rho) / n_questions + seed_sd**2)


def paired_mde(
    sd_question: float,
    n_questions: int,
    seeds: int,
    *,
    seed_sd: float = 0.0,
    rho: float = 0.0,
    paired_sd: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """The smallest true difference arm - baseline that the study's paired (1 - alpha) interval puts wholly on
    its side with probability ``power`` (the verdict "reproduced").

    Per seed s, d_s = delta + noise with SD :func:`per_seed_sd`; the study's interval is the t interval of the
    d_s over S seeds, SE = per_seed_sd / sqrt(S), df = S - 1. The MDE solves :func:`paired_power` (delta, SE,
    S - 1) = power exactly. At many seeds it meets the normal closed form (z_{1-alpha/2} + z_power) * SE; at
    3 seeds, 80% and alpha 0.05 it is 5.653 SE (the shortcut gave 5.364). ``alpha`` is the per-claim level after
    the study's multiplicity control (:func:`claim_alpha`).
    """
    if seeds < 2:
        raise ValueError(f"paired_mde: a paired interval needs >= 2 seeds, got {seeds}")
    if not 0.0 < power < 1.0 or not 0.0 < alpha < 1.0:
        raise ValueError("paired_mde: power and alpha must be in (0, 1)")
    sd = per_seed_sd(sd_question, n_questions, seed_sd=seed_sd, rho=rho, paired_sd=paired_sd)
    se = sd / math.sqrt(seeds)
    if se == 0:
        return 0.0
    df = seeds - 1
    # the power rises with the effect from ~alpha/2 to 1; the root is below 100 SE for any df >= 1
    return float(optimize.brentq(lambda d: paired_power(d, se, df, alpha=alpha) - power, 0.0, 100.0 * se))


def seeds_needed(
    effect: float,
    sd_question: float,
    n_questions: int,
    *,
    seed_sd: float = 0.0,
    rho: float = 0.0,
    paired_sd: float | None = None,
    alpha: float = 0.05,
    max_seeds: int = 100,
) -> int | None:
    """The fewest seeds (>= 3, the studies' floor) whose :func:`paired_mde` is <= ``|effect|``; None when even
    ``max_seeds`` do not suffice (the cap says when that S is beyond any budget this project would spend)."""
    effect = abs(effect)
    for s in range(3, max_seeds + 1):
        mde = paired_mde(
            sd_question, n_questions, s, seed_sd=seed_sd, rho=rho, paired_sd=paired_sd, alpha=alpha
        )
        if mde <= effect:
            return s
    return None


def sd_interval(sd: float, df: int, *, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` chi-square interval of a standard deviation estimated with ``df`` degrees of freedom:
    [sd sqrt(df / chi2_{(1+level)/2}), sd sqrt(df / chi2_{(1-level)/2})]. An SD from 3 seeds (df 2) is uncertain
    by [0.52, 6.28] x itself; the seeds a plan needs are therefore a range (:func:`seeds_range`)."""
    if df < 1:
        raise ValueError(f"sd_interval: df must be >= 1, got {df}")
    low = sd * math.sqrt(df / stats.chi2.ppf((1 + level) / 2, df))
    high = sd * math.sqrt(df / stats.chi2.ppf((1 - level) / 2, df))
    return float(low), float(high)


def seeds_range(
    effect: float, paired_sd: float, pilot_df: int, *, alpha: float = 0.05, max_seeds: int = 100
) -> tuple[int | None, int | None, int | None]:
    """Seeds needed at the low end of the planning SD's 95% interval, at the SD itself and at its high end
    (None: more than ``max_seeds``): the plan with the pilot SD's own uncertainty carried into it."""
    low, high = sd_interval(paired_sd, pilot_df)
    return tuple(  # type: ignore[return-value]
        seeds_needed(effect, 0.0, 1, paired_sd=sd, alpha=alpha, max_seeds=max_seeds)
        for sd in (low, paired_sd, high)
    )


def claim_alpha(alpha: float, claims: int, control: str = "bonferroni") -> float:
    """The per-claim level under the study's multiplicity control: ``bonferroni`` (alpha / claims: every claim's
    interval at 1 - alpha / claims, so all the study's verdicts hold together with probability >= 1 - alpha,
    "effect excluded" and "not reproduced" included, which a step-down on p-values would not give intervals
    for) or ``none``."""
    if control == "none" or claims <= 1:
        return alpha
    if control == "bonferroni":
        return alpha / claims
    raise ValueError(f"claim_alpha: unknown multiplicity control {control!r} (bonferroni or none)")


def runs_evaluations(steps: int, eval_every: int) -> int:
    """Held-out evaluations one run makes (study.run_one / HeldoutEvaluation.due): every ``eval_every`` steps and
    after the last step (once when the last step is itself a multiple)."""
    if eval_every <= 0:
        return 1
    return steps // eval_every + (0 if steps % eval_every == 0 else 1)


def planned_seconds(
    step_seconds: dict[str, float],
    seeds: int,
    steps: int,
    eval_seconds: float,
    eval_every: int,
    critic_only: dict[str, int] | None = None,
) -> dict[str, float]:
    """Per arm: seeds x ((steps + its critic-only steps) x its measured step seconds + evaluations x the seconds
    of one held-out evaluation of every set), and ``total``. The step seconds are each arm's timed first step (an
    RL step: a critic-only step is priced as one, an upper bound); ``critic_only`` holds each arm's critic-only
    steps, run before its ``steps`` policy updates (:meth:`agentcredit.lab.study.Study.critic_only_steps`)."""
    evals = runs_evaluations(steps, eval_every)
    extra = critic_only or {}
    out = {
        arm: seeds * ((steps + extra.get(arm, 0)) * s + evals * eval_seconds)
        for arm, s in step_seconds.items()
    }
    out["total"] = sum(out.values())
    return out


def arm_seeds_to_decide(claims: list[tuple[str, str, int | None]]) -> dict[str, int]:
    """Per arm, the most seeds any claim it takes part in (as arm or baseline) needs to be decided, from
    ``(arm, baseline, seeds_needed)`` per claim; a claim no count of seeds decides (None) adds nothing, and an arm in
    no decidable claim (an extra arm such as a variant) is not run to decide."""
    out: dict[str, int] = {}
    for arm, baseline, needed in claims:
        if needed:
            for name in (arm, baseline):
                out[name] = max(out.get(name, 0), needed)
    return out


def seconds_to_decide(plan: dict[str, float], seeds: int, arm_seeds: dict[str, int]) -> float:
    """Seconds to run each arm at its own seeds to decide (:func:`arm_seeds_to_decide`): each arm's planned seconds
    (``plan``, from :func:`planned_seconds` at ``seeds``) scaled to its count; the other arms run none."""
    return sum(plan[arm] * n / seeds for arm, n in arm_seeds.items() if arm in plan)
