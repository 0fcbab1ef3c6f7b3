"""Write verl's parquet dataset format from agentcredit's task loaders.

One row per question, the columns verl's ``RLHFDataset`` reads:

* ``prompt``: the protocol's opening chat messages (system + user), so ``raw_prompt`` in the agent loop is exactly
  what agentcredit's own engine would prompt with;
* ``data_source``, ``ability``, ``reward_model`` (``{"style": "rule", "ground_truth": [aliases]}``, for verl's
  reward tooling and logs);
* ``extra_info``: ``index``, ``split``, ``id``, ``question``, ``answers``, ``metric`` (the agent loop scores the
  answer with agentcredit's scorer from these), and ``example_info``, the example's own ``info`` as JSON (the task's
  scripted demonstration reads it: GEAR's reference trajectory tau* on verl, as on the native trainer);
* ``agent_name``: ``agentcredit_agent``, so rows select agentcredit's agent loop whatever the default is.

Search-R1's training set is NQ + HotpotQA train (about 170k questions); any split agentcredit's loaders know,
or a JSONL file (``jsonl:<path>``, e.g. Search-R1's ``nq_hotpotqa_train`` exported to JSONL with
``--task-option answer_field=golden_answers``), can be written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentcredit.integrations.verl import AGENT_LOOP_NAME
from agentcredit.protocols import get_protocol
from agentcredit.tasks import Example, load_task

__all__ = ["parse_task_list", "verl_row", "write_parquet"]


def parse_task_list(spec: str) -> list[tuple[str, str | None]]:
    """``"nq:train,hotpotqa"`` -> ``[("nq", "train"), ("hotpotqa", None)]`` (``jsonl:<path>`` kept whole)."""
    out: list[tuple[str, str | None]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.startswith("jsonl:"):
            out.append((item, None))
            continue
        name, _, split = item.partition(":")
        out.append((name, split or None))
    if not out:
        raise ValueError(f"no task in {spec!r}; write e.g. 'nq:train,hotpotqa:train'")
    return out


def verl_row(
    example: Example, index: int, split: str, messages: list[dict[str, str]], ability: str
) -> dict[str, Any]:
    if not example.answers:
        raise ValueError(
            f"{example.task} example {example.id}: no gold answer; the agent loop scores against them"
        )
    return {
        "data_source": example.task,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": list(example.answers)},
        "extra_info": {
            "index": index,
            "split": split,
            "id": example.id,
            "question": example.question,
            "answers": list(example.answers),
            "metric": example.metric,
            # one JSON string, not a struct: the rows' info dicts differ in shape, and parquet columns may not
            "example_info": json.dumps(example.info, sort_keys=True, default=str),
        },
        "agent_name": AGENT_LOOP_NAME,
    }


def write_parquet(
    tasks: Sequence[tuple[str, str | None]],
    path: str | Path,
    *,
    protocol: str = "tags",
    protocol_options: dict[str, Any] | None = None,
    split_name: str = "train",
    limit: int | None = None,
    seed: int = 0,
    ability: str = "search-qa",
    task_options: dict[str, Any] | None = None,
) -> int:
    """Load ``tasks``, render each question with the protocol's messages, write one parquet file; returns rows."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pyarrow comes with verl
        raise ValueError(
            "writing parquet needs pyarrow (pip install -e '.[verl]' in the agentcredit checkout)"
        ) from exc
    proto = get_protocol(protocol, **(protocol_options or {}))
    rows: list[dict[str, Any]] = []
    for name, split in tasks:
        for example in load_task(name, split, limit=limit, seed=seed, **(task_options or {})):
            messages = proto.messages(proto.new_episode(example.question))
            rows.append(verl_row(example, len(rows), split_name, messages, ability))
    if not rows:
        raise ValueError(f"tasks {list(tasks)} gave no examples")
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(rows)
