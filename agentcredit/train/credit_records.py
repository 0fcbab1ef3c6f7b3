"""Per-token credit of a training step as JSONL: what ``agentcredit view`` colours.

One record per trajectory (root-to-leaf path) of the step, with every segment on the path. Policy segments carry,
per token, its text (the token id decoded on its own), the advantage the update used (``TrainBatch.advantages``)
and whether the token entered the loss (``TrainBatch.loss_mask``: carl-critical trains only its selected actions,
so a token can be sampled yet carry no gradient). Observations carry their text and per-token strings, never an
advantage: the environment wrote them, nothing trains on them. The prompt is kept as text only (it is the same
for every trajectory of a tree and usually long).

Byte-level BPE splits some UTF-8 characters over several tokens; decoded alone such a token reads as U+FFFD.
That is what the model saw, so it is shown as is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentcredit.rollout.tree import RolloutTree, segment_step_reward, step_reward_fields
from agentcredit.tasks import Example


def decode_tokens(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token id decoded on its own (special tokens kept, so an end-of-turn marker stays visible)."""
    if not token_ids:
        return []
    return tokenizer.batch_decode([[int(t)] for t in token_ids], skip_special_tokens=False)


def _policy_credit(batch: Any, traj: Any) -> dict[int, tuple[list[float], list[bool], float | None]]:
    """node -> (advantage per token, in-loss per token, V before the segment's first token or None)."""
    out: dict[int, tuple[list[float], list[bool], float | None]] = {}
    for row in traj.rows:
        cols = batch.policy_mask[row].nonzero(as_tuple=True)[0].tolist()
        for col in cols:
            node = int(batch.segment_ids[row, col])
            adv, used, value = out.setdefault(node, ([], [], None))
            if not adv and batch.old_values is not None:
                value = float(batch.old_values[row, col])
                out[node] = (adv, used, value)
            adv.append(float(batch.advantages[row, col]))
            used.append(bool(batch.loss_mask[row, col]))
    return out


def credit_records(
    trees: Sequence[RolloutTree],
    batch: Any,
    examples: Sequence[Example],
    tokenizer: Any,
    *,
    step: int | None = None,
    method: str = "",
) -> list[dict[str, Any]]:
    """The records of :func:`write_credit_episodes` (see the module docstring)."""
    if examples and len(examples) != len(trees):
        raise ValueError(f"credit_records: {len(trees)} trees for {len(examples)} examples")
    if batch.advantages.shape != batch.policy_mask.shape:
        raise ValueError(
            f"credit_records: advantages {tuple(batch.advantages.shape)} and policy_mask "
            f"{tuple(batch.policy_mask.shape)} differ; dump the batch after compute_advantages"
        )
    records = []
    for traj in batch.trajectories:
        tree = trees[traj.tree]
        example = examples[traj.tree] if examples else None
        credit = _policy_credit(batch, traj)
        segments = []
        for node in tree.path(traj.leaf):
            seg = tree.segment(node)
            entry: dict[str, Any] = {
                "node": node,
                "role": seg.role,
                "kind": seg.kind,
                "transient": seg.transient,
                "text": seg.text,
                "n_tokens": len(seg),
            }
            if seg.role != "prompt":
                entry["tokens"] = decode_tokens(tokenizer, seg.token_ids)
            if seg.role == "policy":
                adv, used, value = credit.get(node, ([], [], None))
                if len(adv) != len(seg):
                    raise ValueError(
                        f"tree {traj.tree} node {node}: {len(seg)} policy tokens but {len(adv)} in the batch rows"
                    )
                entry["advantages"] = adv
                entry["in_loss"] = used
                entry["value"] = value
                entry["calls"] = seg.info.get("calls", [])
                entry.update(segment_step_reward(tree, node))
            segments.append(entry)
        leaf_info = tree.nodes[traj.leaf].info
        records.append(
            {
                "step": step,
                "method": method,
                "tree": traj.tree,
                "leaf": traj.leaf,
                "id": example.id if example else tree.prompt_id,
                "question": example.question if example else tree.info.get("question", ""),
                "answers": list(example.answers) if example else [],
                "answer": leaf_info.get("answer"),
                "reward": traj.reward,
                "tool_calls": sum(len(s.get("calls", [])) for s in segments),
                **step_reward_fields(tree, traj.leaf),
                "segments": segments,
            }
        )
    return records


def write_credit_episodes(
    path: str | Path, result: Any, tokenizer: Any, *, step: int | None = None, method: str = ""
):
    """Write a training step's trajectories (``StepResult``: trees, batch, examples) as JSONL; returns the path."""
    path = Path(path)
    records = credit_records(result.trees, result.batch, result.examples, tokenizer, step=step, method=method)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    tmp.replace(path)  # a viewer reading the directory never sees half a file
    return path
