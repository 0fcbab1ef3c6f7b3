"""Peak memory and training speed of one SFT/update pass under each memory setting, side by side in one run.

    .venv/bin/python benchmarks/bench_memory.py [--model embedded] [--examples 128] [--steps 4]
        [--batch 16] [--json]

Every setting trains the same model on the same scripted arith-tools demonstrations of the carl-segment preset
(the tool on half of them, as in the demo's SFT; real episode lengths and policy-token shares), ``--batch`` trajectories per optimiser step, through the same scoring
path as RL (:func:`agentcredit.models.scoring.score_tokens`) and fused AdamW. A setting is a micro-batch size
(``train.micro_batch_tokens``), gradient checkpointing or not (``model.gradient_checkpointing``) and glibc's mmap
threshold (:mod:`agentcredit.runtime`). Each runs in its own child process, because peak RSS (``ru_maxrss``) and
the allocator are per process. Tokens/s counts every non-padding token forwarded and backpropagated, over the
timed steps, after one untimed warm-up step. Ratios are to the first setting, measured in this
run; the machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from agentcredit.runtime import format_rss, peak_rss_gib

MIB = 1 << 20
SETTINGS = [
    # name, micro-batch tokens, gradient checkpointing, glibc mmap threshold (None: glibc's dynamic default)
    ("before: 4096 tok, malloc default", 4096, False, None),
    ("4096 tok, mmap threshold 4 MiB", 4096, False, 4 * MIB),
    ("1024 tok, malloc default", 1024, False, None),
    ("1024 tok, mmap threshold 128 KiB", 1024, False, 128 * 1024),
    ("1024 tok, mmap threshold 4 MiB (default)", 1024, False, 4 * MIB),
    ("512 tok, mmap threshold 4 MiB", 512, False, 4 * MIB),
    ("1024 tok + checkpointing, 4 MiB (demo)", 1024, True, 4 * MIB),
]


def child(args: argparse.Namespace) -> dict:
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.models.loading import load_base_model
    from agentcredit.tasks import load_examples
    from agentcredit.train.batch import build_batch
    from agentcredit.train.sft import demonstrations, sft

    config = load_config("carl-segment-arith-tools", [f"model.name={args.model}"])
    model, tokenizer = load_base_model(config.model.name, config.model.dtype, seed=0)
    if args.ckpt:
        model.gradient_checkpointing_enable()
    env = build_environment(config)
    try:
        trees = demonstrations(
            env, tokenizer, load_examples(config, limit=args.examples), config.protocol.name, tool_share=0.5
        )
    finally:
        env.close()
    if len(trees) < (args.steps + 1) * args.batch:
        raise SystemExit(
            f"{len(trees)} demonstrations for {args.steps} timed steps + 1 warm-up step of {args.batch}: raise --examples"
        )
    warm, timed = trees[: args.batch], trees[args.batch : (args.steps + 1) * args.batch]

    def train(episodes: list) -> float:
        start = time.perf_counter()
        sft(
            model,
            episodes,
            pad_id=tokenizer.pad_token_id or 0,
            epochs=1,
            batch_trajectories=args.batch,
            lr=1e-7,
            max_tokens=args.tokens,
        )
        return time.perf_counter() - start

    train(warm)  # thread pools, first-touch page faults of the weights: not timed
    seconds = train(timed)
    tokens = int(build_batch(timed, pad_id=0).attention_mask.sum())
    return {
        "tokens_per_s": tokens / seconds,
        "peak_rss_gib": peak_rss_gib(),
        "steps": args.steps,
        "tokens_per_step": tokens / args.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--examples", type=int, default=128, help="questions to script demonstrations for")
    parser.add_argument("--steps", type=int, default=4, help="timed optimiser steps per setting")
    parser.add_argument(
        "--batch", type=int, default=16, help="trajectories per optimiser step (the demo's SFT: 16)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=4096, help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", type=int, help="run only these settings (0-based indices)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    load_before = os.getloadavg()
    rows = []
    for i, (name, tokens, ckpt, threshold) in enumerate(SETTINGS):
        if args.only and i not in args.only:
            continue
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--examples", str(args.examples)]
        cmd += ["--steps", str(args.steps), "--batch", str(args.batch), "--tokens", str(tokens)]
        cmd += ["--ckpt"] * ckpt
        # the child is not the CLI, so nothing in it calls agentcredit.runtime.fix_malloc_mmap_threshold: the
        # environment variable (read by glibc at start-up) sets the same threshold, or none
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        if threshold is not None:
            env["MALLOC_MMAP_THRESHOLD_"] = str(threshold)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"setting {name!r} failed:\n{out.stderr[-3000:]}")
        rows.append({"setting": name, **json.loads(out.stdout.strip().splitlines()[-1])})
        print(
            f"  {name}: {format_rss(rows[-1]['peak_rss_gib'])}, {rows[-1]['tokens_per_s']:.0f} tokens/s",
            flush=True,
        )
    result = {"load_before": load_before, "load_after": os.getloadavg(), "settings": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    ref = rows[0]
    print(f"\nload average before {load_before[0]:.2f}, after {result['load_after'][0]:.2f}")
    print(f"{args.batch} trajectories/step, {ref['tokens_per_step']:.0f} tokens/step\n")
    print("| setting | peak RSS GiB | x first | tokens/s | x first |\n|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['peak_rss_gib']:.2f} | {r['peak_rss_gib'] / ref['peak_rss_gib']:.2f} | "
            f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / ref['tokens_per_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
