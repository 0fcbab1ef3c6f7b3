"""The hardware ceiling: matmul FLOP/s of this CPU (fp32, bf16) and each training phase's fraction of it.

    .venv/bin/python benchmarks/bench_flops.py [--n 1024] [--trials 5] [--train-json FILE | --run-train]
        [--methods grpo ...] [--json]

Peak: the best of ``--trials`` timings of n x n matmuls in each dtype (2 n^3 FLOPs each), on the threads torch
uses. Achieved: 2 N FLOPs per token fed in forward-only phases (rollout, signals) and 6 N per token in the update
(forward + backward), N = non-embedding parameters, tokens counted per phase by ``bench train`` (pass its JSON with
``--train-json``, or ``--run-train`` to run it here for ``--methods`` on the embedded model). The fractions are
against the fp32 peak: training and rollouts run in fp32 unless a config turns bf16 on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from agentcredit.lab.bench.flops import matmul_flops, phase_fractions
from agentcredit.lab.bench.train import bench_train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="matrix size")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--train-json", type=Path, help="a `bench train --json` result to take phase tokens from"
    )
    parser.add_argument("--run-train", action="store_true", help="run bench train (embedded model) here")
    parser.add_argument("--methods", nargs="+", default=["grpo"])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    peaks = {
        name: matmul_flops(dtype, n=args.n, trials=args.trials)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    result = {"matmul": peaks}
    bench = None
    if args.train_json:
        bench = json.loads(args.train_json.read_text())
    elif args.run_train:
        bench = bench_train(args.methods, steps=args.steps, log=lambda _msg: None)
    if bench is not None:
        result["non_embedding_parameters"] = bench["non_embedding_parameters"]
        result["phases"] = phase_fractions(bench, peaks["fp32"]["best"])
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, p in peaks.items():
        print(
            f"matmul {name}: best {p['best'] / 1e9:.1f} GFLOP/s, median {p['median'] / 1e9:.1f} GFLOP/s "
            f"(n={int(p['n'])}, {int(p['threads'])} threads)"
        )
    if bench is not None:
        print(
            f"\nN = {bench['non_embedding_parameters'] / 1e6:.1f}M non-embedding parameters; fraction of fp32 peak"
        )
        print("| method | phase | tokens | seconds | GFLOP/s | fraction |")
        print("|---|---|---|---|---|---|")
        for method, phases in result["phases"].items():
            for phase, v in phases.items():
                print(
                    f"| {method} | {phase} | {v['tokens']:.0f} | {v['seconds']:.2f} | "
                    f"{v['flops_per_second'] / 1e9:.2f} | {v['fraction_of_peak']:.1%} |"
                )


if __name__ == "__main__":
    main()
