"""Seconds per training step and per phase (rollout / signals / update) for every method, as ratios to GRPO.

    .venv/bin/python benchmarks/bench_train.py [--methods grpo ppo ...] [--steps N] [--warmup W]
        [--prompts P] [--episodes E] [--model embedded] [--set key=value ...] [--json] [--out FILE]

The same as ``agentcredit bench train``: the seven presets on arith-tools, the same prompts, the same number of
episodes (leaves) per prompt and token caps, the same base weights, one process; GRPO is measured first as the
reference. See :mod:`agentcredit.eval.bench` for what is held equal and what stays per method. The machine's
load average is recorded at the start and the end: quote it with the numbers (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentcredit.eval.bench import METHODS, bench_train, format_bench_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--steps", type=int, default=2, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps per method first")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (the same for all methods)")
    parser.add_argument("--episodes", type=int, default=4, help="episodes (leaves) per prompt")
    parser.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a local model directory")
    parser.add_argument("--task", default="arith-tools")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override key=value"
    )
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--out", type=Path, help="write the full JSON result here")
    args = parser.parse_args()
    result = bench_train(
        args.methods,
        steps=args.steps,
        warmup_steps=args.warmup,
        prompts=args.prompts,
        episodes=args.episodes,
        model=args.model,
        task=args.task,
        overrides=args.overrides,
        log=(lambda _msg: None) if args.json else print,
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text if args.json else format_bench_table(result))


if __name__ == "__main__":
    main()
