"""Small-group statistics on Python floats (private; used by the tree estimators).

The tensor path for whole batches is :func:`agentcredit.credit.methods.grpo.grpo_advantages`; this list version serves
estimators that normalise a handful of values at a time (PORTool's sibling groups and trajectories,
carl-critical's outcome ablation). Both follow the same rules, and a test checks that they agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean, exact when all values are equal (so equal values never look different afterwards).

    Shifting by the first value before an exactly rounded sum keeps mean([x] * n) == x, which a plain
    sum(values) / n does not (e.g. 0.7 * 3 / 3 != 0.7); ties between sibling rewards rely on it.
    """
    ref = values[0]
    return ref + math.fsum(v - ref for v in values) / len(values)


def zscore(values: Sequence[float], eps: float, *, scale: bool = True) -> list[float]:
    """(x - mean) / (std + eps) with the unbiased std (n - 1), as torch.std and verl's GRPO.

    A group of one, or a group whose values are all equal, gets 0 for every member: no comparison is possible,
    and the raw value must never leak through (verl's singleton rule of mean 0 / std 1 would return it).
    ``scale=False`` returns x - mean (Dr.GRPO).
    """
    n = len(values)
    if n < 2 or max(values) == min(values):
        return [0.0] * n
    centre = mean(values)
    centred = [v - centre for v in values]
    if not scale:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]
