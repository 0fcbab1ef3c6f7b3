"""Which GEAR segmentation lets a failing trajectory's deviating turn stand out? (issue 48, docs/results/gear-segments)

Scores the pilot questions of ``studies/gear-mechanism.yaml`` (its scripted failing students, the preset's teacher)
once, keeps every policy token's student and teacher log-prob, entropy and turn, then reads GEAR's weights at A = -1
under each segmentation variant: the paper's scan, a turn's first n tokens opening no segment, segments ending at an
observation. Per variant: W on the deviating turn minus W on the other turns (per episode), and the share of tokens
in segments.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/gear_segments.py --out gear-segments-tokens.json
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/gear_segments.py --tokens gear-segments-tokens.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

from agentcredit.credit import gear_details
from agentcredit.lab.mechanism import load_spec
from agentcredit.lab.mechanism.gear import _student, open_context, questions

VARIANTS = {  # name: (break_at_observation, turn_head_tokens)
    "paper's scan": (False, 0),
    "crossing, first token opens none": (False, 1),
    "ending at an observation": (True, 0),
    "ending at an observation, first token opens none": (True, 1),
    "ending at an observation, first 3 tokens open none": (True, 3),
}


def score(study: Path) -> list[dict]:
    from agentcredit.credit.methods.gear.teacher import gear_teacher_logprobs
    from agentcredit.rollout.replay import replay
    from agentcredit.train import signals
    from agentcredit.train.batch import build_batch

    spec = load_spec(study)
    ctx = open_context(spec)
    env, model, tokenizer, settings = ctx["env"], ctx["model"], ctx["tokenizer"], ctx["settings"]
    rows = []
    try:
        for example in questions(spec, "pilot"):
            for kind in spec.deviations:
                tree = replay(
                    env.protocol,
                    tokenizer,
                    env.tools,
                    example.question,
                    _student(kind, example.info["chain"]),
                )
                tree.set_reward(tree.leaves()[0], 0.0)
                batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
                student, entropy, _ = signals.score_batch(model, batch)
                teacher = gear_teacher_logprobs(
                    partial(signals.logprobs_under_prompts, model), tokenizer, env.protocol, batch, [tree], {0: example}, settings.template,
                    references={0: ctx["references"](example)},
                )  # fmt: skip
                tokens = []
                for k, (row, first, last) in enumerate(signals.segment_spans(batch, batch.trajectories[0])):
                    for c in range(first, last + 1):
                        if bool(batch.policy_mask[row, c]):
                            tokens.append(
                                {
                                    "turn": k,
                                    "tok": tokenizer.decode([int(batch.input_ids[row, c])]),
                                    "s": float(student[row, c]),
                                    "t": float(teacher[row, c]),
                                    "h": float(entropy[row, c]),
                                }
                            )
                rows.append({"id": example.id, "kind": kind, "deviating_turn": 1, "tokens": tokens})
                print(example.id, kind, len(tokens), flush=True)
    finally:
        env.close()
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| segmentation | W(dev) - W(others): mean | SD | episodes > 0 | share in segments |",
        "|---|---|---|---|---|",
    ]
    for name, (brk, head) in VARIANTS.items():
        gaps, fracs = [], []
        for row in rows:
            toks = row["tokens"]
            turns = [t["turn"] for t in toks]
            d = gear_details(
                -1.0,
                torch.tensor([t["s"] for t in toks], dtype=torch.float64),
                torch.tensor([t["t"] for t in toks], dtype=torch.float64),
                torch.tensor([t["h"] for t in toks], dtype=torch.float64),
                torch.ones(len(toks), dtype=torch.bool),
                normalisation="auto",
                turn_starts=torch.tensor([i > 0 and turns[i] != turns[i - 1] for i in range(len(turns))]),
                break_at_observation=brk,
                turn_head_tokens=head,
            )
            on = torch.tensor([t == row["deviating_turn"] for t in turns])
            gaps.append(float(d.weights[on].mean() - d.weights[~on].mean()))
            fracs.append(d.frac_in_segments)
        lines.append(
            f"| {name} | {statistics.mean(gaps):.3f} | {statistics.stdev(gaps):.3f} | "
            f"{sum(g > 0 for g in gaps)} / {len(gaps)} | {statistics.mean(fracs):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("studies/gear-mechanism.yaml"))
    parser.add_argument("--out", type=Path, help="score the pilot questions and keep the tokens here")
    parser.add_argument("--tokens", type=Path, help="tokens kept by an earlier --out (no scoring)")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.tokens is None):
        print("error: give --out (score) or --tokens (read)", file=sys.stderr)
        return 2
    if args.out is not None:
        rows = score(args.study)
        args.out.write_text(json.dumps(rows) + "\n")
    else:
        rows = json.loads(args.tokens.read_text())
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
