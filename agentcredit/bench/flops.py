"""The hardware ceiling: measured matmul FLOP/s of this CPU, and the fraction of it each training phase achieves.

Peak: square ``n x n`` matmuls (2 n^3 FLOPs each) timed with torch on the threads torch uses, for fp32 and bf16;
the best of several trials is the ceiling (the machine may be shared, so the best trial is the least disturbed).

Achieved: the usual transformer estimate, FLOPs ~ 2 N per token for a forward pass and 6 N per token for forward
plus backward, with N the non-embedding parameters and the tokens counted by :class:`agentcredit.bench.train.
PhaseTokens` (every position fed to a decoder). Rollout and signals are forward-only (2 N); the update runs
forward + backward (6 N). Attention's own FLOPs (~ 2 n_layer n_ctx d per token) and the LM head, applied only
where a log-prob is needed, are left out, so the fractions are slight underestimates.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

FLOPS_PER_TOKEN = {"rollout": 2, "signals": 2, "update": 6}  # x N (non-embedding parameters)


def matmul_flops(
    dtype: torch.dtype = torch.float32, *, n: int = 1024, trials: int = 5, min_seconds: float = 0.3
) -> dict[str, float]:
    """FLOP/s of ``n x n @ n x n`` matmuls in ``dtype``: ``{"best", "median", "n", "threads"}``."""
    if n < 1 or trials < 1:
        raise ValueError(f"matmul_flops: need n >= 1 and trials >= 1, got n={n}, trials={trials}")
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, caches
    rates = []
    for _ in range(trials):
        reps, start = 0, time.perf_counter()
        while True:
            torch.matmul(a, b, out=out)
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(2.0 * n**3 * reps / elapsed)
    return {
        "best": max(rates),
        "median": statistics.median(rates),
        "n": float(n),
        "threads": float(torch.get_num_threads()),
    }


def phase_flops(tokens: dict[str, float], non_embedding_parameters: int) -> dict[str, float]:
    """FLOPs of each phase from its token count: factor (2 forward, 6 train) x N x tokens."""
    unknown = set(tokens) - set(FLOPS_PER_TOKEN)
    if unknown:
        raise ValueError(
            f"phase_flops: unknown phase(s) {sorted(unknown)}; phases are {sorted(FLOPS_PER_TOKEN)}"
        )
    return {p: FLOPS_PER_TOKEN[p] * non_embedding_parameters * float(t) for p, t in tokens.items()}


def phase_fractions(bench: dict[str, Any], peak_flops: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per method and phase of a ``bench train`` result: FLOPs, achieved FLOP/s and fraction of ``peak_flops``."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    n = int(bench["non_embedding_parameters"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method, entry in bench["methods"].items():
        flops = phase_flops(entry["tokens_per_step"], n)
        out[method] = {}
        for phase, f in flops.items():
            seconds = entry[f"{phase}_seconds"]
            achieved = f / seconds if seconds > 0 else float("nan")
            out[method][phase] = {
                "tokens": float(entry["tokens_per_step"][phase]),
                "flops": f,
                "seconds": seconds,
                "flops_per_second": achieved,
                "fraction_of_peak": achieved / peak_flops,
            }
    return out
