"""Write verl's parquet dataset format from agentcredit's task loaders.

One row per question, the columns verl's ``RLHFDataset`` reads:

* ``prompt``: the protocol's opening chat messages (system + user), so ``raw_prompt`` in the agent loop is exactly
  what agentcredit's own engine would prompt with;
* ``data_source``, ``ability``, ``reward_model`` (``{"style": "rule", "ground_truth": [aliases]}``, for verl's
  reward tooling and logs);
* ``extra_info``: ``index``, ``split``, ``id``, ``question``, ``answers``, ``metric`` (the agent loop scores the
  answer with agentcredit's scorer from these), ``example_info``, the example's own ``info`` as JSON (the task's
  scripted demonstration reads it: GEAR's reference trajectory tau* on verl, as on the native trainer), and
  ``protocol``, the protocol and options the prompt was rendered with as JSON (:func:`check_protocol`: the trainer
  and the agent loop refuse a file whose prompts another protocol's parser would read);
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

__all__ = [
    "check_data_files",
    "check_protocol",
    "method_protocol",
    "parse_task_list",
    "protocol_tag",
    "verl_row",
    "write_parquet",
]


def protocol_tag(protocol: str, options: dict[str, Any] | None) -> str:
    """How a row records the protocol its prompt was rendered with (``extra_info.protocol``): canonical JSON."""
    return json.dumps({"name": protocol, "options": dict(options or {})}, sort_keys=True)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def method_protocol(method: str) -> tuple[str, dict[str, Any]]:
    """The protocol and options a method's shipped config prompts with: its recipe's ``agentcredit:`` block merged
    on the base's, as Hydra merges them (no verl needed); a method without a recipe gets the base's."""
    import yaml

    from agentcredit.integrations.verl import config_dir, config_name

    def block(name: str) -> dict[str, Any]:
        text = (config_dir() / f"{name}.yaml").read_text(encoding="utf-8")
        return (yaml.safe_load(text) or {}).get("agentcredit") or {}

    merged = _merge(block("agentcredit_base"), block(config_name(method)))
    return str(merged.get("protocol", "tags")), dict(merged.get("protocol_options") or {})


def check_protocol(extra_info: Any, protocol: str, options: dict[str, Any], where: str) -> None:
    """Refuse a row whose prompt was rendered for another protocol than the one that will parse the replies: the
    model would be prompted for one format and read with another (reward ~ 0, no error otherwise)."""
    tag = (extra_info or {}).get("protocol") if isinstance(extra_info, dict) else None
    want = protocol_tag(protocol, options)
    if tag is None:
        raise ValueError(
            f"{where}: extra_info.protocol is missing, so its prompts' protocol is unknown; rewrite it with "
            f"`python -m agentcredit.integrations.verl prepare-data --method <method>`"
        )
    if json.loads(tag) != json.loads(want):
        raise ValueError(
            f"{where}: prompts rendered for protocol {tag}, but agentcredit.protocol / protocol_options parse "
            f"{want}; rewrite it with `python -m agentcredit.integrations.verl prepare-data --method <method>`"
        )


def check_data_files(files: Any, protocol: str, options: dict[str, Any]) -> None:
    """:func:`check_protocol` on the first row of each parquet file (a path or a list of paths)."""
    import pyarrow.parquet as pq

    paths = [files] if isinstance(files, str) else list(files or [])
    for path in paths:
        path = str(path)
        if "://" in path:  # a remote file verl copies first (hdfs://...): the agent loop checks its rows
            continue
        try:
            first = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=["extra_info"]), None)
        except FileNotFoundError:
            raise ValueError(
                f"{path}: no such file; write it with `python -m agentcredit.integrations.verl prepare-data "
                f"--method <method>`"
            ) from None
        if first is None or first.num_rows == 0:
            continue
        check_protocol(first.to_pylist()[0]["extra_info"], protocol, options, path)


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
    example: Example,
    index: int,
    split: str,
    messages: list[dict[str, str]],
    ability: str,
    protocol: str = "tags",
    protocol_options: dict[str, Any] | None = None,
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
            "protocol": protocol_tag(protocol, protocol_options),
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
            rows.append(
                verl_row(example, len(rows), split_name, messages, ability, protocol, protocol_options)
            )
    if not rows:
        raise ValueError(f"tasks {list(tasks)} gave no examples")
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(rows)
