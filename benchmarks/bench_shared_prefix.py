"""The update's forward + backward with shared prefixes forwarded once vs row by row, side by side in one run.

    .venv/bin/python benchmarks/bench_shared_prefix.py [--model embedded] [--prompt 1050] [--depth 3]
        [--segment 40] [--max-tokens 4096] [--repeats 3] [--json]

The rows are one rollout tree's trajectories: a ``--prompt``-token prompt, then ``--depth`` levels of steps of
``--segment`` tokens that fork in two at every level (2^depth trajectories; PORTool's f = 2, the jsoncall prompt
of its CPU preset is about 1,050 tokens), plus one GRPO-like group with the same prompt and no shared steps. Each
is scored as the trainer's update scores it (``micro_batches`` packed, or ``padded_chunks`` row by row, within
``--max-tokens`` positions; ``score_tokens`` with a policy-gradient-shaped loss on the generated tokens, then backward), once with ``share_prefixes`` and once without,
alternating, ``--repeats`` times; the best time of each is kept. Printed: positions fed to the decoder, seconds and
their ratios, and the largest difference between the two in log-prob and gradient (they must agree within 1e-5
up to float rounding). The load average before and after is printed: on a shared machine the times move, the
positions do not.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from agentcredit.models.loading import load_base_model
from agentcredit.models.packing import padded_chunks
from agentcredit.models.scoring import micro_batches, score_tokens
from agentcredit.train.signals import pad_rows


def tree_rows(prompt: int, depth: int, segment: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(100, 40000, (n,), generator=g).tolist()

    rows = [tokens(prompt) + tokens(segment)]  # the prompt and the first step, shared by every trajectory
    for _ in range(depth):
        rows = [row + tokens(segment) for row in rows for _ in range(2)]
    return rows


def group_rows(prompt: int, n: int, length: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(100, 40000, (prompt,), generator=g).tolist()
    return [head + torch.randint(100, 40000, (length,), generator=g).tolist() for _ in range(n)]


def pass_once(model, rows, prompt, max_tokens, shared):
    """One update-shaped forward + backward over ``rows``; (seconds, positions fed, log-probs, grads)."""
    ids, attn = pad_rows(rows, range(len(rows)), pad_id=0)
    T = ids.shape[1]
    want = attn.clone()
    want[:, :prompt] = False
    model.zero_grad(set_to_none=True)
    fed = 0
    logp = torch.zeros(len(rows), T)
    start = time.perf_counter()
    # the chunks each path would get: distinct tokens packed, rows x padded width row by row
    chunks = (
        micro_batches(model, rows, max_tokens) if shared else padded_chunks(list(map(len, rows)), max_tokens)
    )
    for chunk in chunks:
        width = int(attn[chunk].sum(-1).max())
        s = score_tokens(
            model, ids[chunk, :width], attn[chunk, :width], want[chunk, :width], share_prefixes=shared
        )
        (-(s.logprobs * want[chunk, :width]).sum() / want.sum()).backward()
        fed += s.forwarded
        logp[chunk, :width] = s.logprobs.detach()
    seconds = time.perf_counter() - start
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return seconds, fed, logp, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompt", type=int, default=1050)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--segment", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model, _ = load_base_model(args.model, "float32", seed=0)
    model.train()
    model.gradient_checkpointing_enable()
    leaves = 2**args.depth
    cases = {
        f"tree ({leaves} trajectories, fork in 2 at {args.depth} steps)": tree_rows(
            args.prompt, args.depth, args.segment
        ),
        f"group ({leaves} trajectories, the prompt shared)": group_rows(
            args.prompt, leaves, args.segment * (args.depth + 1)
        ),
    }
    out = {"load_average_start": os.getloadavg(), "threads": torch.get_num_threads(), "cases": {}}
    for name, rows in cases.items():
        best = {False: float("inf"), True: float("inf")}
        results = {}
        for _ in range(args.repeats):
            for shared in (False, True):
                seconds, fed, logp, grads = pass_once(model, rows, args.prompt, args.max_tokens, shared)
                best[shared] = min(best[shared], seconds)
                results[shared] = (fed, logp, grads)
        (fed_rows, lp_rows, g_rows), (fed_packed, lp_packed, g_packed) = results[False], results[True]
        out["cases"][name] = {
            "rows": len(rows),
            "tokens_in_rows": sum(map(len, rows)),
            "positions_row_by_row": fed_rows,
            "positions_packed": fed_packed,
            "seconds_row_by_row": best[False],
            "seconds_packed": best[True],
            "speedup": best[False] / best[True],
            "max_logprob_difference": float((lp_rows - lp_packed).abs().max()),
            "max_gradient_difference": float((g_rows - g_packed).abs().max()),
            "max_gradient": float(g_rows.abs().max()),
        }
    out["load_average_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.model}, {out['threads']} torch threads, load average {out['load_average_start']}")
    print(
        "| rows | positions row by row / packed | seconds row by row / packed | speed-up | max |dlogp| | max |dgrad| |"
    )
    print("|---|---|---|---|---|---|")
    for name, c in out["cases"].items():
        print(
            f"| {name} | {c['positions_row_by_row']} / {c['positions_packed']} "
            f"| {c['seconds_row_by_row']:.2f} / {c['seconds_packed']:.2f} | {c['speedup']:.2f}x "
            f"| {c['max_logprob_difference']:.1e} | {c['max_gradient_difference']:.1e} |"
        )
    print(f"load average at the end {out['load_average_end']}")


if __name__ == "__main__":
    main()
