"""Seconds per training step and per phase (rollout / signals / update) for every method, as ratios to GRPO.

    .venv/bin/python benchmarks/bench_train.py [--methods grpo --methods ppo ...] [--steps N] [--warmup W]
        [--prompts P] [--episodes E] [--model embedded] [--set key=value ...] [--json] [--out FILE]

The script form of ``agentcredit bench train`` (same options: ``--help``): the seven presets on arith-tools, the
same prompts, episodes (leaves) per prompt and token caps, the same base weights, one process; GRPO is measured
first and last as the reference. See :mod:`agentcredit.lab.bench.train` for what is held equal and what stays per
method. The machine's load average is recorded at the start and the end: quote it with the numbers.
"""

import sys

from agentcredit.cli import app

if __name__ == "__main__":
    app(["bench", "train", *sys.argv[1:]], prog_name="bench_train.py")
