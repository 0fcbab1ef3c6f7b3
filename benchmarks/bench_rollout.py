"""Rollout engine benchmark: batched engine vs a naive ``generate`` loop, and prefix reuse in tree rollouts.

    .venv/bin/python benchmarks/bench_rollout.py [--model embedded|PATH] [--prompts 16] [--episodes 4]
        [--task kb-multihop|arith-tools] [--threads N] [--skip-naive] [--json]

The script form of ``agentcredit bench rollout`` (same options: ``--help``); see :mod:`agentcredit.lab.bench.rollout`
for what is measured and held equal. With ``--json`` the last line printed is one JSON object with
``engine_tokens_per_s``, ``naive_tokens_per_s``, ``speedup`` and ``tree_prefill_ratio``. The machine's load
average is recorded at the start and the end: quote it with the numbers.
"""

import sys

from agentcredit.cli import app

if __name__ == "__main__":
    app(["bench", "rollout", *sys.argv[1:]], prog_name="bench_rollout.py")
