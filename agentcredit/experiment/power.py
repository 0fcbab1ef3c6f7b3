"""Power before spending: a claim's minimum detectable effect (MDE) and the CPU budget a study plans.

Pure functions (no model, no files); :mod:`agentcredit.experiment.preflight` feeds them what the start measured.

The design is the study's: every arm runs the same seeds, and in one seed every arm sees the same training
questions in the same order from the same start and is evaluated on the same held-out questions. A claim's value
per seed is d_s = mean over the n held-out questions q of (arm_{s,q} - baseline_{s,q}); the report's primary
interval is the paired t interval of the d_s over the S seeds (``study_report.paired_interval``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# t_{0.975, df} for df = 1..30; beyond 30 the normal quantile is within 2%.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom.

    Exact (3 decimals) at integer df <= 30, linear in between (fractional Welch df), and beyond 30
    1.960 + 0.082 * 30 / df, which meets the table at 30 and the normal quantile at infinity (within 0.003).
    """
    if not df >= 1:
        raise ValueError(f"t975: degrees of freedom must be >= 1, got {df}")
    if df >= len(_T975):
        return 1.960 + (_T975[-1] - 1.960) * len(_T975) / df
    d = int(math.floor(df))
    return _T975[d - 1] + (df - d) * (_T975[d] - _T975[d - 1])


# t_{0.80, df} for df = 1..30 (the one-sided quantile a power of 80% needs); beyond 30 see t80.
_T80 = (
    1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879,
    0.876, 0.873, 0.870, 0.868, 0.866, 0.865, 0.863, 0.862, 0.861, 0.860,
    0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854,
)  # fmt: skip
Z80 = 0.8416  # the normal quantile at 0.80
Z975 = 1.9600


def t80(df: float) -> float:
    """The 0.80 quantile of Student's t with ``df`` >= 1 degrees of freedom (table to 30, then
    0.8416 + 0.0124 * 30 / df, which meets the table at 30 and the normal quantile at infinity)."""
    if not df >= 1:
        raise ValueError(f"t80: degrees of freedom must be >= 1, got {df}")
    if df >= len(_T80):
        return Z80 + (_T80[-1] - Z80) * len(_T80) / df
    d = int(math.floor(df))
    return _T80[d - 1] + (df - d) * (_T80[d] - _T80[d - 1])


def question_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1) of the start's per-question values of a metric (0 for one value).

    For a 0/1 metric with rate p over n questions it is sqrt(p (1 - p) n / (n - 1))."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired_mde(
    sd_question: float,
    n_questions: int,
    seeds: int,
    *,
    seed_sd: float = 0.0,
    rho: float = 0.0,
) -> float:
    """The smallest true difference arm - baseline that the study's paired 95% interval excludes 0 for with 80%
    power (alpha 0.05 two-sided, as the verdict reads the interval; ``lower``/``higher`` claims then hold when the
    whole interval is on the claimed side).

    Derivation. Per seed s, d_s = (1/n) sum_q (a_{s,q} - b_{s,q}) = delta + u_s + e_s, where e_s is the question
    noise and u_s what seed s does to one arm and not the other (a collapse, a lucky question order), with
    variance ``seed_sd``^2 (it cancels in the pairing only insofar as it hits both arms alike). If each arm's
    per-question value has the start's spread sigma (``sd_question``) and the two arms' values on one question
    correlate with ``rho`` (0: independent draws, the conservative default; both arms starting from one policy
    makes rho > 0), Var(a_q - b_q) = 2 sigma^2 (1 - rho) and Var(e_s) = 2 sigma^2 (1 - rho) / n. Hence

        Var(d_s) = 2 sigma^2 (1 - rho) / n + seed_sd^2,  SE = sqrt(Var(d_s) / S).

    The paired t test over S seeds rejects when |mean d| > t_{0.975, S-1} SE; with the true difference at
    delta its statistic is centred at delta / SE, so power 0.8 needs delta / SE >= t_{0.975, S-1} + t_{0.80, S-1}
    (the usual approximation of the noncentral t by a shifted central t):

        MDE = (t_{0.975, S-1} + t_{0.80, S-1}) * sqrt((2 sigma^2 (1 - rho) / n + seed_sd^2) / S).

    With S -> infinity the t quantiles become 1.960 + 0.842 = 2.802 (the normal closed form).
    """
    if n_questions < 1:
        raise ValueError(f"paired_mde: n_questions must be >= 1, got {n_questions}")
    if seeds < 2:
        raise ValueError(f"paired_mde: a paired interval needs >= 2 seeds, got {seeds}")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"paired_mde: rho must be in [0, 1], got {rho}")
    if sd_question < 0 or seed_sd < 0:
        raise ValueError("paired_mde: standard deviations must be >= 0")
    df = seeds - 1
    variance = 2.0 * sd_question**2 * (1.0 - rho) / n_questions + seed_sd**2
    return (t975(df) + t80(df)) * math.sqrt(variance / seeds)


def seeds_needed(
    effect: float,
    sd_question: float,
    n_questions: int,
    *,
    seed_sd: float = 0.0,
    rho: float = 0.0,
    max_seeds: int = 100,
) -> int | None:
    """The fewest seeds (>= 3, the studies' floor) whose :func:`paired_mde` is <= ``|effect|``; None when even
    ``max_seeds`` do not suffice (the MDE falls as 1/sqrt(S), so any effect > 0 is reached at some S; the cap says
    when that S is beyond any budget this project would spend)."""
    effect = abs(effect)
    for s in range(3, max_seeds + 1):
        if paired_mde(sd_question, n_questions, s, seed_sd=seed_sd, rho=rho) <= effect:
            return s
    return None


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
    steps, run before its ``steps`` policy updates (:meth:`agentcredit.experiment.study.Study.critic_only_steps`)."""
    evals = runs_evaluations(steps, eval_every)
    extra = critic_only or {}
    out = {
        arm: seeds * ((steps + extra.get(arm, 0)) * s + evals * eval_seconds)
        for arm, s in step_seconds.items()
    }
    out["total"] = sum(out.values())
    return out
