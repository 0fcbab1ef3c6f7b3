"""Critic-quality metrics: AUC, expected calibration error, explained variance, sign accuracy.

carl-segment §3.9 / §4.4 / App. I: AUC of V(s_0) between Tier 1 and Tier 2 questions, ECE over 10 equal-width
bins, EV = 1 - Var(R - V) / Var(R), and the sign accuracy of V after a retrieval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _arrays(scores: Sequence[float], labels: Sequence[float], name: str) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(
            f"{name}: scores and labels must be 1-D and equally long, got {s.shape} and {y.shape}"
        )
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{name}: scores contain NaN or inf")
    return s, y


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Area under the ROC curve for binary ``labels`` (1 = positive): P(score_pos > score_neg), ties count 1/2.

    Written as the Mann-Whitney statistic with average ranks; NaN when one class is empty.
    """
    s, y = _arrays(scores, labels, "auc")
    pos, neg = s[y == 1], s[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = ranks[y == 1].sum()
    return float((rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def expected_calibration_error(
    probs: Sequence[float], outcomes: Sequence[float], bins: int = 10, *, confidence: str = "mean"
) -> float:
    """ECE with ``bins`` equal-width bins on [0, 1]: sum_b |B_b|/n * |acc_b - conf_b|.

    ``confidence="mean"`` takes conf_b = the mean predicted probability in the bin (spec carl-segment §6 [R]);
    ``"midpoint"`` takes the bin's midpoint, the variant that reproduces every ECE of the paper's Tab. 11.
    """
    return calibration_error(reliability_table(probs, outcomes, bins), confidence=confidence)


def calibration_error(rows: Sequence[dict[str, float]], *, confidence: str = "mean") -> float:
    """ECE from a reliability table (:func:`reliability_table` rows, or the paper's Tab. 11 bins).

    Rows need ``count`` and ``observed``; ``predicted`` for ``confidence="mean"``, ``low``/``high`` for
    ``"midpoint"``. Empty bins contribute nothing; NaN when every bin is empty.
    """
    if confidence not in ("mean", "midpoint"):
        raise ValueError(f"calibration_error: confidence must be 'mean' or 'midpoint', got {confidence!r}")
    total = sum(int(r["count"]) for r in rows)
    if total == 0:
        return float("nan")
    ece = 0.0
    for r in rows:
        if r["count"] == 0:
            continue
        conf = r["predicted"] if confidence == "mean" else (r["low"] + r["high"]) / 2
        ece += r["count"] / total * abs(r["observed"] - conf)
    return float(ece)


def brier_score(probs: Sequence[float], outcomes: Sequence[float]) -> float:
    """Mean squared error of a probability against the 0/1 outcome (carl-segment §6); NaN when empty."""
    p, y = _arrays(probs, outcomes, "brier_score")
    if len(p) == 0:
        return float("nan")
    return float(np.mean((p - y) ** 2))


def reliability_table(
    probs: Sequence[float], outcomes: Sequence[float], bins: int = 10
) -> list[dict[str, float]]:
    """Per bin: range, count, mean predicted probability, observed rate (for calibration plots).

    Bins are equal-width on [0, 1], closed on the left, the last one closed on both sides (p = 1 falls in it).
    """
    if bins < 1:
        raise ValueError(f"reliability_table: bins must be >= 1, got {bins}")
    p, y = _arrays(probs, outcomes, "reliability_table")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("reliability_table: probabilities must lie in [0, 1]")
    idx = np.minimum((p * bins).astype(int), bins - 1)
    rows = []
    for b in range(bins):
        sel = idx == b
        rows.append(
            {
                "low": b / bins,
                "high": (b + 1) / bins,
                "count": int(sel.sum()),
                "predicted": float(p[sel].mean()) if sel.any() else float("nan"),
                "observed": float(y[sel].mean()) if sel.any() else float("nan"),
            }
        )
    return rows


def explained_variance(values: Sequence[float], returns: Sequence[float]) -> float:
    """EV = 1 - Var(R - V) / Var(R) (carl-segment §3.9); NaN when Var(R) = 0."""
    v, r = _arrays(values, returns, "explained_variance")
    var = r.var()
    if len(r) < 2 or var == 0:
        return float("nan")
    return float(1 - (r - v).var() / var)


def oracle_explained_variance(success_rates: Sequence[float], states: Sequence[object]) -> float:
    """The explained variance an oracle critic reaches, in expectation, when it knows every state's true success
    rate: trajectory i ends in R_i ~ Bernoulli(p_i) from state ``states[i]`` (equal weights), the oracle predicts
    V(s) = the mean p_i of the trajectories that start in s, and

        EV = 1 - E[Var(R - V)] / Var(R) = Var(V) / (Var(p) + mean p(1 - p)),

    since E(R_i - V_i)^2 = p_i (1 - p_i) + (p_i - V_i)^2 and Var(p) = Var(V) + mean (p - V)^2 (the law of total
    variance). Trajectories that share a state but not a success rate (carl-segment's warm-up with every mode's
    rollouts re-rendered into one s_0) cap what any critic can explain; it is the ceiling the gate's EV >= 0.45
    (carl-segment App. C) is measured against. NaN when every p_i is 0 or every p_i is 1 (Var(R) = 0).
    """
    p = np.asarray(success_rates, dtype=np.float64)
    if p.ndim != 1 or len(p) != len(states) or len(p) == 0:
        raise ValueError(f"oracle_explained_variance: {p.shape} rates for {len(states)} states")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("oracle_explained_variance: success rates must lie in [0, 1]")
    groups: dict[object, list[int]] = {}
    for i, s in enumerate(states):
        groups.setdefault(s, []).append(i)
    v = np.empty_like(p)
    for members in groups.values():
        v[members] = p[members].mean()
    var_r = p.var() + (p * (1 - p)).mean()
    if var_r <= 0:
        return float("nan")
    return float(v.var() / var_r)


def sign_accuracy(deltas: Sequence[float], expected_positive: Sequence[bool]) -> float:
    """Fraction of deltas whose sign matches the expectation (carl-segment A22); a zero delta counts as wrong."""
    d = np.asarray(deltas, dtype=np.float64)
    e = np.asarray(expected_positive, dtype=bool)
    if d.shape != e.shape:
        raise ValueError(f"sign_accuracy: {d.shape} deltas for {e.shape} expectations")
    if len(d) == 0:
        return float("nan")
    return float(np.mean(np.where(e, d > 0, d < 0)))
