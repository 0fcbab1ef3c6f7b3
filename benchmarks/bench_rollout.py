"""Rollout engine benchmark: batched engine vs a naive ``generate`` loop, and prefix reuse in tree rollouts.

    .venv/bin/python benchmarks/bench_rollout.py [--model embedded|PATH] [--dtype float32] [--prompts 16]
        [--episodes 4] [--task kb-multihop|arith-tools] [--threads N] [--json]

The same as ``agentcredit bench rollout``; see :mod:`agentcredit.rollout.bench` for what is measured and held
equal. With ``--json`` the last line printed is one JSON object with ``engine_tokens_per_s``,
``naive_tokens_per_s``, ``speedup`` and ``tree_prefill_ratio`` (prefilled tokens with reuse / without, PORTool
f = 2). The machine's load average is recorded at the start and the end: quote it with the numbers.
"""

from __future__ import annotations

import argparse
import json

from agentcredit.rollout.bench import BenchSettings, bench_rollout, format_result


def main() -> None:
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="embedded", help="'embedded' or a local Hugging Face model directory"
    )
    parser.add_argument("--dtype", default="float32", help="weights of both loops: float32 or bfloat16")
    parser.add_argument("--prompts", type=int, default=defaults.prompts)
    parser.add_argument("--episodes", type=int, default=defaults.episodes, help="engine episodes per prompt")
    parser.add_argument("--task", default=defaults.task, choices=["kb-multihop", "arith-tools"])
    parser.add_argument("--max-segment-tokens", type=int, default=defaults.max_segment_tokens)
    parser.add_argument("--max-episode-tokens", type=int, default=defaults.max_episode_tokens)
    parser.add_argument("--tree-prompts", type=int, default=defaults.tree_prompts)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--skip-naive", action="store_true", help="only the engine and the trees")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (last line)")
    args = parser.parse_args()
    settings = BenchSettings(
        prompts=args.prompts,
        episodes=args.episodes,
        task=args.task,
        max_segment_tokens=args.max_segment_tokens,
        max_episode_tokens=args.max_episode_tokens,
        tree_prompts=args.tree_prompts,
    )
    result = bench_rollout(
        args.model,
        dtype=args.dtype,
        settings=settings,
        threads=args.threads,
        skip_naive=args.skip_naive,
        log=(lambda _msg: None) if args.json else print,
    )
    print(json.dumps(result) if args.json else format_result(result))


if __name__ == "__main__":
    main()
