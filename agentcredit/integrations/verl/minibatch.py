"""Mini-batches of trajectories on verl, whose mini-batches are rows.

verl's actor and critic split the batch into mini-batches of ``ppo_mini_batch_size x rollout.n`` *rows*
(``train_mini_batch``: each data-parallel rank takes a contiguous slice of the batch and cuts it into contiguous
chunks of ``mini_batch_size / dp`` rows, optionally shuffled), and the ``seq-mean-*`` loss modes divide by that
same constant row count. carl-segment's replacement mode renders one episode as several rows (one per view), so
with verl's own layout the number of optimizer steps per epoch grows with the number of views, an episode's rows
can land in different mini-batches, and a trajectory's loss weight grows with its row count.

:func:`plan_minibatches` lays the rows out so that every mini-batch holds exactly ``episodes_per_minibatch``
whole episodes and the same number of rows (padding rows fill the gap). With that layout the optimizer steps
per epoch are ``episodes / episodes_per_minibatch`` as in agentcredit's own trainer, and a per-token advantage
factor ``rows_per_minibatch / episodes_per_minibatch`` turns verl's ``seq-mean-token-sum`` (a sum over the
mini-batch divided by its row count) into a mean over the mini-batch's trajectories.

The last mini-batch may hold fewer episodes: verl's sync trainer trains on a batch with whatever rows its sessions
produced (a failed session, e.g. a sandbox preflight or a teacher call that raised, leaves its prompt's group
short), and a multi-row method must not end the run where GRPO just pads. The short mini-batch is padded to the
same row count and keeps the nominal factor, so each of its episodes weighs what it would in a full one (the
missing ones weigh 0, as verl's padding rows do for one-row methods).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["MinibatchPlan", "plan_minibatches"]


@dataclass(frozen=True)
class MinibatchPlan:
    """The row order to hand verl and the row count of each of its mini-batches.

    ``order`` lists, in the order verl will dispatch them, the index of a row of the input batch or ``None``
    for a padding row; ``len(order) == n_minibatches * rows_per_minibatch``.
    """

    order: list[int | None]
    rows_per_minibatch: int
    episodes_per_minibatch: int
    n_minibatches: int
    episodes: int = (
        0  # episodes in the batch; fewer than n_minibatches x episodes_per_minibatch if one is short
    )

    @property
    def missing_episodes(self) -> int:
        """Episode slots of the short last mini-batch left empty (0 when the count is an exact multiple)."""
        return self.n_minibatches * self.episodes_per_minibatch - self.episodes

    @property
    def rows_per_episode(self) -> float:
        """The factor that makes verl's per-row mean a per-trajectory mean (rows / trajectories per mini-batch)."""
        return self.rows_per_minibatch / self.episodes_per_minibatch


def plan_minibatches(
    episode_of_row: Sequence[Hashable],
    episodes_per_minibatch: int,
    *,
    dp_size: int = 1,
    row_multiple: int = 1,
    micro_batch_per_rank: int = 1,
) -> MinibatchPlan:
    """Lay the rows out so that verl's row mini-batches are mini-batches of whole episodes.

    Args:
        episode_of_row: the episode of every row (rows of one episode need not be adjacent).
        episodes_per_minibatch: trajectories per optimizer step (``ppo_mini_batch_size x rollout.n``).
        dp_size: verl's data-parallel size: rank r receives the r-th contiguous slice of the batch.
        row_multiple: the row count of a mini-batch is rounded up to a multiple of this (and of ``dp_size``),
            e.g. ``rollout.n`` so that it can be written back as a whole ``ppo_mini_batch_size``.
        micro_batch_per_rank: each rank's share of a mini-batch is rounded up to a multiple of this: without
            dynamic batch sizes verl cuts a rank's rows into micro-batches of ``*_micro_batch_size_per_gpu`` and
            asserts that they divide evenly (``prepare_micro_batches``), for the updates (a mini-batch) and for the
            log-prob and value passes (the rank's whole slice, a whole number of mini-batch shares).

    Episodes keep their first-appearance order and are cut into consecutive groups of
    ``episodes_per_minibatch``, the last one possibly short; every group is padded to the largest group's row
    count. Each rank's slice is its share of every mini-batch, in mini-batch order, so its contiguous chunks of
    ``rows_per_minibatch / dp_size`` rows (verl's unshuffled iterator) are the planned mini-batches.
    :attr:`MinibatchPlan.rows_per_episode` stays the nominal ``rows_per_minibatch / episodes_per_minibatch`` for a
    short group too.
    """
    if min(episodes_per_minibatch, dp_size, row_multiple, micro_batch_per_rank) < 1:
        raise ValueError(
            f"episodes_per_minibatch ({episodes_per_minibatch}), dp_size ({dp_size}), row_multiple "
            f"({row_multiple}) and micro_batch_per_rank ({micro_batch_per_rank}) must be >= 1"
        )
    rows_of: dict[Hashable, list[int]] = {}
    for row, episode in enumerate(episode_of_row):
        rows_of.setdefault(episode, []).append(row)
    episodes = list(rows_of.values())
    if not episodes:
        raise ValueError("plan_minibatches: the batch has no rows")
    groups = [
        [row for ep in episodes[i : i + episodes_per_minibatch] for row in ep]
        for i in range(0, len(episodes), episodes_per_minibatch)
    ]
    multiple = math.lcm(dp_size * micro_batch_per_rank, row_multiple)
    width = -(-max(len(g) for g in groups) // multiple) * multiple
    padded: list[list[int | None]] = [g + [None] * (width - len(g)) for g in groups]
    share = width // dp_size
    order = [slot for rank in range(dp_size) for g in padded for slot in g[rank * share : (rank + 1) * share]]
    return MinibatchPlan(order, width, episodes_per_minibatch, len(groups), len(episodes))
