"""From rollout trees to padded training tensors.

Every root-to-leaf path of every tree is one *trajectory*. A trajectory becomes one row per training view
(:meth:`RolloutTree.training_views`): one row normally, more in carl-segment's replacement mode, where each row is the
exact context its policy tokens were sampled under. Rows are right-padded.

Per token the batch carries:
* ``policy_mask`` — the policy tokens this row trains (each policy token of a trajectory is in exactly one of its rows);
* ``loss_mask`` — the subset that enters the loss (the update set; carl-critical trains only selected actions, once);
* ``segment_ids`` — the tree node each token came from (-1 on padding), so per-segment quantities broadcast to tokens.

:func:`segment_spans` locates each policy segment of a trajectory; :func:`agentcredit.train.advantages.episode_batch`
turns them into the estimators' neutral layout (:mod:`agentcredit.credit.estimators`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from agentcredit.rollout.tree import RolloutTree


@dataclass
class Trajectory:
    tree: int  # index of the tree in the batch
    leaf: int  # leaf node id
    rows: list[int]  # batch rows holding its views, in order
    policy_nodes: list[int]  # its policy segments' node ids, root to leaf
    reward: float


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] bool
    policy_mask: torch.Tensor  # [N, L] bool
    loss_mask: torch.Tensor  # [N, L] bool
    segment_ids: torch.Tensor  # [N, L] long, node id or -1
    row_traj: torch.Tensor  # [N] long, trajectory index of each row
    old_logp: torch.Tensor  # [N, L] float32 (recomputed by the trainer)
    advantages: torch.Tensor  # [N, L] float32
    behaviour_logp: torch.Tensor  # [N, L] float32, recorded by the rollout engine
    behaviour_entropy: torch.Tensor  # [N, L]
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None  # [N, L] values of the state before each token
    value_mask: torch.Tensor | None = None  # [N, L] bool, where the value loss applies
    returns: torch.Tensor | None = None  # [N, L] value targets
    old_entropy: torch.Tensor | None = None
    # [N, L, K] the advantage's terms when each gets its own clipped min (PORTool's split min); None = one min
    advantage_parts: torch.Tensor | None = None
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> TrainBatch:
        """This batch with its tensors on ``device`` (itself where they already are: no copy on the host)."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        if all(moved[name] is getattr(self, name) for name in moved):
            return self
        return replace(self, **moved)

    def select(self, rows: Sequence[int]) -> TrainBatch:
        """The sub-batch of these rows (trajectory bookkeeping is dropped; losses only need tensors)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.input_ids.device)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value.index_select(0, index)
            elif f.name == "trajectories":
                out[f.name] = []
            else:
                out[f.name] = value
        sub = TrainBatch(**out)
        # trim right padding to the longest row of the sub-batch: saves compute on ragged batches
        length = int(sub.attention_mask.sum(-1).max()) if sub.num_rows else 0
        for f in fields(sub):
            value = getattr(sub, f.name)
            if isinstance(value, torch.Tensor) and value.dim() >= 2:  # [N, L] and [N, L, K]
                setattr(sub, f.name, value[:, :length])
        return sub


def build_batch(trees: Sequence[RolloutTree], *, pad_id: int = 0) -> TrainBatch:
    """Lay out every trajectory of every tree as rows (see the module docstring)."""
    rows_ids, rows_mask, rows_seg, rows_lp, rows_ent, row_traj = [], [], [], [], [], []
    trajectories: list[Trajectory] = []
    for t, tree in enumerate(trees):
        rewards = tree.rewards()
        for leaf in tree.leaves():
            path = tree.path(leaf)
            traj = Trajectory(
                tree=t,
                leaf=leaf,
                rows=[],
                policy_nodes=[i for i in path if tree.segment(i).role == "policy"],
                reward=rewards[leaf],
            )
            for view in tree.training_views(leaf):
                traj.rows.append(len(rows_ids))
                row_traj.append(len(trajectories))
                rows_ids.append(view.token_ids)
                rows_mask.append(view.policy_mask)
                rows_seg.append(view.segment_index)
                rows_lp.append(view.logprobs)
                rows_ent.append(view.entropies)
            trajectories.append(traj)
    if not rows_ids:
        raise ValueError("build_batch: the trees hold no trajectory")
    N, L = len(rows_ids), max(len(r) for r in rows_ids)

    def pad(rows, value, dtype):
        out = torch.full((N, L), value, dtype=dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
        return out

    input_ids = pad(rows_ids, pad_id, torch.long)
    attention = pad([[True] * len(r) for r in rows_ids], False, torch.bool)
    policy = pad(rows_mask, False, torch.bool)
    zeros = torch.zeros(N, L, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        policy_mask=policy,
        loss_mask=policy.clone(),
        segment_ids=pad(rows_seg, -1, torch.long),
        row_traj=torch.as_tensor(row_traj, dtype=torch.long),
        old_logp=zeros.clone(),
        advantages=zeros.clone(),
        behaviour_logp=pad(rows_lp, 0.0, torch.float32),
        behaviour_entropy=pad(rows_ent, 0.0, torch.float32),
        trajectories=trajectories,
    )


def segment_spans(batch: TrainBatch, traj: Trajectory) -> list[tuple[int, int, int]]:
    """(row, first col, last col) of each of the trajectory's policy segments, in temporal order.

    With the alignment of :mod:`agentcredit.models.scoring`, the value read at the first column is V(b_k), the boundary
    state the segment was generated from; turn rewards go on the last column.
    """
    out = []
    for node in traj.policy_nodes:
        for r in traj.rows:
            cols = ((batch.segment_ids[r] == node) & batch.policy_mask[r]).nonzero(as_tuple=True)[0]
            if cols.numel():
                out.append((r, int(cols[0]), int(cols[-1])))
                break
        else:
            raise ValueError(
                f"policy segment {node} of trajectory (tree {traj.tree}, leaf {traj.leaf}) has no tokens"
            )
    return out


def actions_per_question(batch: TrainBatch, mask: torch.Tensor) -> float:
    """Distinct actions (policy segments, i.e. tree nodes) with a token in ``mask``, per question (tree).

    An action shared by several trajectories of a tree (a common prefix) counts once. With ``mask`` the loss mask
    this is what carl-critical calls the updated actions (paper: 72% fewer than GRPO), measured the same way for
    every method, so the study can compare them.
    """
    seen: set[tuple[int, int]] = set()
    for traj in batch.trajectories:
        for r in traj.rows:
            nodes = batch.segment_ids[r][mask[r] & batch.policy_mask[r]]
            seen.update((traj.tree, int(n)) for n in nodes.unique() if n >= 0)
    trees = {traj.tree for traj in batch.trajectories}
    return len(seen) / max(len(trees), 1)
