"""carl-segment: one advantage per tool-use segment from a critic read at segment boundaries.

Paper: "CARL: segment-level credit assignment for LLM tool use" (spec ``carl-segment.md`` Sec. 3). An episode
with K tool calls has N + 1 = 2K + 1 segments (invoke, assimilate) x K then commit; segment k is generated from
boundary state b_k (transient states after a raw tool output and persistent ones alike), and the critic gives
V(b_0), ..., V(b_N). With a terminal-only reward R (Eq. 4 with r_k = 0 for k < N, r_N = R)::

    delta_k = gamma * V(b_{k+1}) - V(b_k)        k < N
    delta_N = R - V(b_N)                          (V(b_{N+1}) = 0: the episode has ended)
    A_k     = sum_{l >= 0} (gamma * lam)^l * delta_{k+l}          segment-level GAE, Eq. 6

``lam = 0`` (the paper's choice, Table 5) gives Eq. 1: A_k = V(b_{k+1}) - V(b_k) and A_N = R - V(b_N), which
telescope to R - V(b_0) (Eq. 5). ``lam = 1`` with ``gamma = 1`` gives A_k = R - V(b_k) (Eq. 7), the
trajectory-level limit of the lambda ablation (App. H.1). Every policy token of segment k shares A_k, and the
loss is Eq. 3: ``policy_loss(..., agg="segment-mean")``.

``gamma`` is a discount per *segment* (the issue's contract). The paper's SMDP TD error (App. A, Eq. 4) discounts
by gamma^{tau_k}, tau_k = the segment's length in tokens; where the two differ the paper wins, so passing
``segment_lengths`` switches to Eq. 4: delta_k = gamma^{tau_k} V(b_{k+1}) - V(b_k) and
A_k = delta_k + gamma^{tau_k} * lam * A_{k+1}. At the paper's gamma = 1 (the only value it uses) both agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from agentcredit.credit._validate import as_int, finite_float, float_list, unit_interval

__all__ = ["segment_advantages"]


def segment_advantages(
    boundary_values: Sequence[float] | Tensor,
    reward: float,
    *,
    lam: float = 0.0,
    gamma: float = 1.0,
    segment_lengths: Sequence[int] | None = None,
    segment_rewards: Sequence[float] | None = None,
) -> list[float]:
    """Advantages of the N + 1 segments of one episode.

    Args:
        boundary_values: ``[V(b_0), ..., V(b_N)]``, the critic at the start of each segment (at least one).
        reward: the outcome reward R of the episode (EM in {0, 1} in the paper).
        lam: segment-level GAE lambda (paper value 0.0, one-step TD).
        gamma: discount (paper value 1.0), per segment, or per token with ``segment_lengths``.
        segment_lengths: tau_k, the token count of each segment; when given, segment k is discounted by
            gamma^{tau_k} as in the paper's SMDP Eq. 4 (default None: one discount step per segment).
        segment_rewards: r_0, ..., r_{N-1}, rewards earned during the intermediate segments (Eq. 4's r_k; the
            paper's reward is terminal-only, so the default None means all zero). Used to compose carl-segment's
            boundary critic with TIPS turn rewards: delta_k = r_k + gamma V(b_{k+1}) - V(b_k).

    Returns:
        ``[A_0, ..., A_N]`` as Python floats.
    """
    values = float_list(boundary_values, "boundary_values", min_len=1)
    reward = finite_float(reward, "reward")
    lam = unit_interval(lam, "lam")
    gamma = unit_interval(gamma, "gamma")
    n = len(values)
    if segment_lengths is None:
        discounts = [gamma] * n
    else:
        if isinstance(segment_lengths, str | bytes) or not isinstance(segment_lengths, Sequence):
            raise ValueError(
                f"segment_lengths must be a sequence of ints, got {type(segment_lengths).__name__}"
            )
        if len(segment_lengths) != n:
            raise ValueError(
                f"segment_lengths has {len(segment_lengths)} entries but boundary_values has {n}; give one per segment"
            )
        taus = [as_int(tau, f"segment_lengths[{k}]") for k, tau in enumerate(segment_lengths)]
        for k, tau in enumerate(taus):
            if tau < 1:
                raise ValueError(f"segment_lengths[{k}] = {tau}: a segment has at least one token")
        discounts = [gamma**tau for tau in taus]
    next_values = values[1:] + [0.0]
    if segment_rewards is None:
        step_rewards = [0.0] * (n - 1) + [reward]
    else:
        intermediate = float_list(segment_rewards, "segment_rewards")
        if len(intermediate) != n - 1:
            raise ValueError(
                f"segment_rewards has {len(intermediate)} entries; give one per intermediate segment ({n - 1})"
            )
        step_rewards = intermediate + [reward]
    out = [0.0] * n
    running = 0.0
    for k in range(n - 1, -1, -1):
        delta = step_rewards[k] + discounts[k] * next_values[k] - values[k]
        running = delta + discounts[k] * lam * running
        out[k] = running
    return out
