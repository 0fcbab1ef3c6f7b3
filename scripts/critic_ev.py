"""Explained variance of a PPO-family critic over its critic-only steps, on fresh batches (issue 48).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/critic_ev.py --preset ppo-arith-tools \\
        --steps 5 --cache /path/batches.json [--set optim.head_lr=1e-3 ...] [--label NAME] [--out result.json]

The preset's run, on the embedded SmolLM2-135M-Instruct unless ``--set model.name=...``, with every step critic-only:
during those steps the policy does not move, so every batch is a sample of the initial policy. ``--cache`` holds
the batches (their trees and question ids): the first call rolls them out and writes them, later calls with other
``--set`` read the same batches, so settings are compared on identical episodes. Step t's ``critic EV`` is
1 - Var(G - V) / Var(G) over the batch's value positions with V computed *before* the update on that batch (the
trainer's ``critic/explained_variance``), i.e. on episodes the critic has not trained on. One line per step, and
the settings, the load average and the seconds to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def _load_average() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ppo-arith-tools")
    parser.add_argument(
        "--steps", type=int, default=5, help="critic-only steps (the presets' train.critic_warmup)"
    )
    parser.add_argument("--set", action="append", default=[], help="a config override key=value (repeatable)")
    parser.add_argument("--cache", type=Path, required=True, help="the batches (written on first use)")
    parser.add_argument("--label", default="", help="a name for this setting in --out")
    parser.add_argument("--out", type=Path, help="append the result as one JSON line here")
    parser.add_argument(
        "--head-sweep",
        action="store_true",
        help="instead of the trainer: a linear value head on the initial critic's features (computed once per "
        "batch), trained with AdamW at each --head-lr for each --updates per batch, from a zero or a mean-return "
        "bias; EV per step on the fresh batch, as above (what the head alone can reach, in seconds)",
    )
    parser.add_argument(
        "--head-lr", type=float, action="append", help="head-sweep LRs (default 1e-4, 1e-3, 1e-2)"
    )
    parser.add_argument(
        "--updates", type=int, action="append", help="head-sweep updates per batch (default 1, 8)"
    )
    args = parser.parse_args(argv)

    from agentcredit.config import ConfigError, load_config
    from agentcredit.rollout.tree import RolloutTree
    from agentcredit.train.trainer import Trainer

    overrides = [
        *args.set,
        f"train.critic_warmup={args.steps}",
        f"train.steps={args.steps}",
        "train.save_every=0",
    ]
    try:
        config = load_config(args.preset, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.algorithm.critic == "none":
        print(f"error: --preset {args.preset}: its method has no critic", file=sys.stderr)
        return 2
    began, load_before = time.perf_counter(), _load_average()
    trainer = Trainer(config, log=False)
    try:
        by_id = {e.id: e for e in trainer.examples}
        if args.cache.is_file():
            stored = json.loads(args.cache.read_text())
            if stored["preset"] != args.preset or len(stored["batches"]) < args.steps:
                print(
                    f"error: --cache {args.cache}: holds {stored['preset']} x {len(stored['batches'])}",
                    file=sys.stderr,
                )
                return 2
            batches = [
                ([RolloutTree.from_dict(t) for t in b["trees"]], [by_id[i] for i in b["ids"]])
                for b in stored["batches"][: args.steps]
            ]
        else:  # the initial policy's batches, as the critic-only steps of a run sample them
            batches = []
            for _ in range(args.steps):
                examples = trainer.sampler.next(config.rollout.prompts_per_step)
                trees, _ = trainer.rollout(examples)
                batches.append((trees, examples))
                trainer.step += 1  # the next batch's rollout seed, as in a run
            trainer.step = 0
            args.cache.parent.mkdir(parents=True, exist_ok=True)
            args.cache.write_text(
                json.dumps(
                    {
                        "preset": args.preset,
                        "batches": [
                            {"trees": [t.to_dict() for t in trees], "ids": [e.id for e in ex]}
                            for trees, ex in batches
                        ],
                    }
                )
            )
        if args.head_sweep:
            rows = head_sweep(trainer, batches, args.head_lr or [1e-4, 1e-3, 1e-2], args.updates or [1, 8])
            args.steps = len(batches)
            return _write(args, rows, began, load_before)
        rows = []
        print(f"{'step':>4} {'critic EV':>10} {'V mean':>8} {'G mean':>8} {'G sd':>7} {'value loss':>11}")
        for trees, examples in batches:
            result = trainer.learn(trees, examples)
            m, b = result.metrics, result.batch
            ret = b.returns[b.value_mask]
            row = {
                "step": trainer.step,
                "explained_variance": m.get("critic/explained_variance", math.nan),
                "value_mean": m.get("critic/value_mean", math.nan),
                "return_mean": float(ret.mean()),
                "return_sd": float(ret.std()),
                "value_loss": m.get("loss/value", math.nan),
                "critic_only": m.get("update/critic_only", 0.0),
            }
            rows.append(row)
            print(
                f"{row['step']:>4} {row['explained_variance']:>10.4f} {row['value_mean']:>8.4f} "
                f"{row['return_mean']:>8.4f} {row['return_sd']:>7.4f} {row['value_loss']:>11.5f}",
                flush=True,
            )
    finally:
        trainer.close()
    return _write(args, rows, began, load_before)


def _write(args, rows, began, load_before) -> int:
    import torch

    result = {
        "label": args.label,
        "preset": args.preset,
        "set": args.set,
        "steps": rows,
        "seconds": time.perf_counter() - began,
        "load_average": [load_before, _load_average()],
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if args.out is not None:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(result) + "\n")
    return 0


def head_sweep(trainer, batches, lrs, updates) -> list[dict]:
    """EV per step of a linear head ``Linear(d, 1)`` (the presets' TokenValueHead) on the initial critic's features.

    The features are the hidden states the value head reads (position t - 1 for V before token t) at every policy
    token, from the critic model as it starts (the base model); the target is the episode's reward at every one
    of its tokens, which is the trainer's return G_t for PPO with gamma = lam = 1 and an outcome reward only.
    Step t: EV of the head on batch t (before it trains on it), then ``u`` full-batch AdamW updates on batch t
    (weight decay 0, no clipping: the head alone). Rows: one per (lr, updates, bias init, step)."""
    import torch

    from agentcredit.credit.metrics import explained_variance
    from agentcredit.train.batch import build_batch
    from agentcredit.train.warmup import boundary_features

    model = trainer.critic_model if trainer.critic_model is not None else trainer.model
    model.eval()
    data = []
    for trees, _ in batches:
        batch = build_batch(trees, pad_id=trainer.pad_id)
        positions: dict[int, list[int]] = {}
        for r, c in batch.policy_mask.nonzero().tolist():
            positions.setdefault(r, []).append(c)
        feats = boundary_features(model, batch, positions, max_tokens=trainer.cfg.train.micro_batch_tokens)
        keys = sorted(feats)
        reward = {r: batch.trajectories[int(batch.row_traj[r])].reward for r in positions}
        x = torch.stack([feats[k] for k in keys])
        y = torch.tensor([reward[r] for r, _ in keys], dtype=torch.float32)
        data.append((x, y))
    out = []
    # the best a linear head can do with every earlier batch: ridge regression fitted on batches 1..t-1 (features
    # centred on their mean, intercept = the mean return), EV on batch t
    print(f"{'ridge lambda':>12}  EV per step (fresh batch; fitted on all earlier batches)")
    for lam in (1.0, 10.0, 100.0, 1000.0):
        evs = [float("nan")]
        for t in range(1, len(data)):
            x = torch.cat([d[0] for d in data[:t]]).double()
            y = torch.cat([d[1] for d in data[:t]]).double()
            mx, my = x.mean(0), y.mean()
            xc = x - mx
            w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(x.shape[1], dtype=x.dtype), xc.T @ (y - my))
            v = (data[t][0].double() - mx) @ w + my
            evs.append(explained_variance(v.tolist(), data[t][1].tolist()))
            out.append({"ridge": lam, "step": t + 1, "explained_variance": evs[-1]})
        print(f"{lam:>12g}  " + " ".join(f"{e:7.3f}" for e in evs), flush=True)
    print(f"{'head lr':>8} {'updates':>7} {'bias init':>9}  EV per step (fresh batch)")
    for lr in lrs:
        for u in updates:
            for init in ("zero", "mean"):
                head = torch.nn.Linear(data[0][0].shape[1], 1)
                torch.nn.init.zeros_(head.weight)
                torch.nn.init.zeros_(head.bias)
                opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
                evs = []
                for t, (x, y) in enumerate(data):
                    if t == 0 and init == "mean":  # the first batch's mean return, before its EV is read
                        with torch.no_grad():
                            head.bias.fill_(float(y.mean()))
                    with torch.no_grad():
                        v = head(x).squeeze(-1)
                    evs.append(
                        explained_variance(v.tolist(), y.tolist()) if float(y.var()) > 0 else float("nan")
                    )
                    for _ in range(u):
                        opt.zero_grad()
                        loss = 0.5 * ((head(x).squeeze(-1) - y) ** 2).mean()
                        loss.backward()
                        opt.step()
                    out.append(
                        {
                            "lr": lr,
                            "updates": u,
                            "bias_init": init,
                            "step": t + 1,
                            "explained_variance": evs[-1],
                        }
                    )
                print(f"{lr:>8.0e} {u:>7} {init:>9}  " + " ".join(f"{e:7.3f}" for e in evs), flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
