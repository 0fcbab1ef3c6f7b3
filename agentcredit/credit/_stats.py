"""Group statistics (private; shared by the estimators).

:func:`group_zscores` is the tensor path for whole batches (GRPO's advantages and the other group estimators);
the list version :func:`zscore` serves estimators that normalise a handful of values at a time (PORTool's sibling
groups and trajectories, carl-critical's outcome ablation). Both follow the same rules, and a test checks that they agree.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from agentcredit.credit._validate import finite_float, finite_where, float_list


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


def group_zscores(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable] | Tensor,
    *,
    eps: float = 1e-6,
    scale: bool = True,
) -> Tensor:
    """Per-group z-scores of ``rewards`` (``[B]``; a list becomes the default dtype), groups by equal label in
    ``group_ids``: (x - mean_g) / (std_g + eps) with the unbiased std, or x - mean_g when ``scale=False``. A group
    of one, or a group whose values are all equal, gets 0 (as :func:`zscore`). Keeps the dtype of ``rewards``."""
    if isinstance(rewards, Tensor):
        if not rewards.is_floating_point():
            raise ValueError(f"rewards must be a floating-point tensor, got dtype {rewards.dtype}")
        if rewards.dim() != 1:
            raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
        finite_where(rewards, "rewards")
    else:
        rewards = torch.tensor(float_list(rewards, "rewards"), dtype=torch.get_default_dtype())
    eps = finite_float(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    labels = group_ids.tolist() if isinstance(group_ids, Tensor) else group_ids
    if isinstance(labels, str | bytes) or not isinstance(labels, Sequence):
        raise ValueError(
            f"group_ids must be a sequence with one label per episode, got {type(labels).__name__}"
        )
    if len(labels) != rewards.shape[0]:
        raise ValueError(f"group_ids has {len(labels)} labels but rewards has {rewards.shape[0]} entries")
    if rewards.shape[0] == 0:
        return rewards.clone()

    index: dict[Hashable, int] = {}
    try:
        inverse = [index.setdefault(label, len(index)) for label in labels]
    except TypeError as err:
        raise ValueError(f"group_ids must hold hashable labels: {err}") from None
    inv = torch.tensor(inverse, dtype=torch.long, device=rewards.device)
    n_groups = len(index)

    zeros = rewards.new_zeros(n_groups)
    counts = zeros.index_add(0, inv, torch.ones_like(rewards))
    mean = zeros.index_add(0, inv, rewards) / counts
    centred = rewards - mean[inv]
    # Unbiased variance; groups of one are zeroed below, the clamp only avoids 0/0 on them.
    var = zeros.index_add(0, inv, centred * centred) / (counts - 1).clamp(min=1)
    high = zeros.scatter_reduce(0, inv, rewards, reduce="amax", include_self=False)
    low = zeros.scatter_reduce(0, inv, rewards, reduce="amin", include_self=False)
    degenerate = (counts < 2) | (high == low)

    adv = centred / (var.sqrt()[inv] + eps) if scale else centred
    return torch.where(degenerate[inv], torch.zeros_like(adv), adv)
