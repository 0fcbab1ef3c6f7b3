"""``python -m agentcredit.integrations.verl``: the two helpers a verl launch needs.

* ``config-dir``: print the directory of the Hydra configs (verl's ``--config-path``).
* ``prepare-data``: write the train / validation parquet files from agentcredit's task loaders.
* ``tiny-model``: write the random two-layer model verl's CPU run trains (:mod:`.tiny`).

Both run without verl (``prepare-data`` needs pyarrow, which verl brings).
"""

from __future__ import annotations

import argparse
import sys

from agentcredit.credit.methods import DEFAULT_METHOD
from agentcredit.integrations.verl import config_dir


def _options(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} expects key=value, got {pair!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentcredit.integrations.verl")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("config-dir", help="print the Hydra config directory (verl's --config-path)")
    tiny = sub.add_parser("tiny-model", help="write a random two-layer Qwen2 (byte tokenizer) for a CPU run")
    tiny.add_argument("--out", required=True, help="model directory (actor_rollout_ref.model.path)")
    tiny.add_argument("--seed", type=int, default=0)
    prep = sub.add_parser("prepare-data", help="write verl parquet files from agentcredit tasks")
    prep.add_argument(
        "--train",
        required=True,
        help="tasks[:split], comma-separated; e.g. jsonl:~/data/search_r1/train.jsonl (NQ + HotpotQA train)",
    )
    prep.add_argument("--val", default="nq,hotpotqa", help="tasks[:split] for validation ('' = none)")
    prep.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="loader option for every task, e.g. answer_field=golden_answers for Search-R1's JSONL",
    )
    prep.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help="the method the data is for: its config's protocol renders the prompts (the parser that reads the "
        "replies must be the one the prompt asks for; the trainer refuses a mismatch)",
    )
    prep.add_argument(
        "--out",
        default=None,
        help="directory for train/val.parquet (default: $HOME/data/agentcredit/search_r1/<method>, where the "
        "shipped configs' data.train_files / val_files look)",
    )
    prep.add_argument(
        "--protocol",
        default=None,
        help="override the method config's protocol (then pass the same to the run)",
    )
    prep.add_argument("--protocol-option", action="append", default=[], metavar="KEY=VALUE")
    prep.add_argument("--limit", type=int, default=None, help="at most this many questions per task")
    prep.add_argument(
        "--val-limit", type=int, default=500, help="validation questions per task (seeded subset)"
    )
    prep.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.command == "config-dir":
        print(config_dir())
        return 0
    if args.command == "tiny-model":
        from agentcredit.integrations.verl.tiny import build_tiny_model

        print(f"wrote {build_tiny_model(args.out, seed=args.seed)}")
        return 0

    from pathlib import Path

    from agentcredit.credit.methods import get_method
    from agentcredit.integrations.verl.data import method_protocol, parse_task_list, write_parquet

    try:
        get_method(args.method)
    except ValueError as exc:
        print(f"--method: {exc}", file=sys.stderr)
        return 2
    protocol, options = method_protocol(args.method)
    if args.protocol is not None and args.protocol != protocol:
        protocol, options = args.protocol, {}
    options = _options(args.protocol_option, "--protocol-option") or options
    task_options = _options(args.task_option, "--task-option")
    out = Path(args.out or f"~/data/agentcredit/search_r1/{args.method}").expanduser().resolve()
    n = write_parquet(
        parse_task_list(args.train),
        out / "train.parquet",
        protocol=protocol,
        protocol_options=options,
        split_name="train",
        limit=args.limit,
        seed=args.seed,
        task_options=task_options,
    )
    print(f"wrote {n} rows to {out / 'train.parquet'}")
    if args.val:
        n = write_parquet(
            parse_task_list(args.val),
            out / "val.parquet",
            protocol=protocol,
            protocol_options=options,
            split_name="val",
            limit=args.val_limit,
            seed=args.seed,
            task_options=task_options if args.val.startswith("jsonl:") else {},
        )
        print(f"wrote {n} rows to {out / 'val.parquet'}")
    print(f"prompts rendered with protocol {protocol} {options}, for agentcredit.method={args.method}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
