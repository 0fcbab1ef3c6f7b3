"""``agentcredit probe-credit``: where each credit estimator puts its credit, on the same rollouts.

A run config's model rolls out the run's first *training* prompts with the config's strategy, once, in the run's
step-sized batches with each step's seed (the first batch has the run's step-1 prompts, weights and seed). Then
each named estimator computes its advantages on those same trees (no update, no held-out question) and the steps'
credit is tabulated by step kind and trajectory outcome (:func:`agentcredit.train.metrics.credit_by_step_kind`).
The trees and rewards are shared, so a difference between columns is the estimators' alone.

The statistic that says which way a method pushes: per question, the mean advantage of its tool-call steps minus
that of its answer steps (over the trajectories that got the question wrong, and over all), with a 95% t interval
across questions (questions are independent; the steps of one question are not). Positive means its advantages favour
calling a tool over answering. Outcome-only GRPO gives every step of a trajectory the same advantage, so its
difference comes only from which trajectories the steps belong to.

Only estimators that need nothing besides the trees run here (no critic values, teacher, or shaping), and the
config's shaping, reweighting and advantage whitening are switched off: this probes the estimators, not the full
methods. The rewards are those of the config's method (PORTool's judge for a PORTool config: +1 / 0 / -1; exact
match in {0, 1} otherwise), and the trees its strategy's: an estimator's column is what it would give *on that
run's rollouts and rewards*, not on the rollouts and rewards of its own preset.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentcredit.config import Config
from agentcredit.credit import METHODS
from agentcredit.lab.study_report import mean_interval
from agentcredit.train.advantages import compute_advantages
from agentcredit.train.batch import build_batch
from agentcredit.train.metrics import StepCredit, credit_by_step_kind, episode_metrics, step_credits
from agentcredit.train.signals import Signals
from agentcredit.train.trainer import Trainer

#: The preset ``agentcredit probe-credit`` rolls out when given no ``--config``: PORTool's judge (+1 / 0 / -1) on a
#: multi-hop search task, where the estimators differ most in where they put credit.
PROBE_PRESET = "portool-kb-multihop"
#: The estimating methods the probe can run, by name: those that need no critic values (see the module docstring).
PROBE_ESTIMATORS = tuple(m.name for m in METHODS.values() if m.estimate and m.needs.critic == "none")


def call_minus_answer(credits: Sequence[StepCredit], outcomes: Sequence[str]) -> list[float]:
    """Per question (tree) with both kinds among trajectories of these ``outcomes``: mean advantage of its ``call``
    steps minus that of its ``answer`` steps."""
    by_tree: dict[int, dict[str, list[float]]] = {}
    for c in credits:
        if c.outcome in outcomes and c.kind in ("call", "answer"):
            by_tree.setdefault(c.tree, {"call": [], "answer": []})[c.kind].append(c.advantage)
    return [
        math.fsum(k["call"]) / len(k["call"]) - math.fsum(k["answer"]) / len(k["answer"])
        for _, k in sorted(by_tree.items())
        if k["call"] and k["answer"]
    ]


def probe_credit(
    config: Config,
    *,
    prompts: int,
    estimators: Sequence[str],
    log: Callable[[str], None] = print,
    **trainer_args: Any,
) -> dict[str, Any]:
    """Roll out ``prompts`` training prompts once and credit them with each estimator; returns the numbers.

    ``trainer_args`` go to :class:`~agentcredit.train.trainer.Trainer` (``model``, ``tokenizer``, ``examples``)."""
    unknown = [e for e in estimators if e not in PROBE_ESTIMATORS]
    if unknown:
        raise ValueError(
            f"probe-credit: estimator(s) {unknown} not available here; choose from {list(PROBE_ESTIMATORS)}"
        )
    # estimators only: no shaping, reweighting or batch-wide whitening (questions stay independent for the interval)
    base = config.algorithm.model_copy(update={"whiten_advantages": False})
    # no KL reference or TIPS teacher copy is built; the estimator (and so the environment's reward) is the config's
    rollout_config = config.model_copy(update={"algorithm": base.model_copy(update={"kl_coef": 0.0})})
    trainer = Trainer(rollout_config, log=False, **trainer_args)
    per_step = config.rollout.prompts_per_step
    examples, trees = [], []
    try:
        # in the run's step-sized batches, each with that step's engine seed: the first batch has the run's step-1
        # prompts, weights and seed (its samples match the run's where the arithmetic does, e.g. the same thread
        # count), and memory stays that of a training step
        while len(examples) < prompts:
            chunk = trainer.sampler.next(min(per_step, prompts - len(examples)))
            log(
                f"rolling out training prompts {len(examples) + 1}-{len(examples) + len(chunk)} of {prompts} "
                f"({config.rollout.strategy} strategy, step {trainer.step + 1}'s seed)"
            )
            trees += trainer.rollout(chunk)[0]
            examples += chunk
            trainer.step += 1
    finally:
        trainer.close()
    batch = build_batch(trees, pad_id=trainer.pad_id)
    result: dict[str, Any] = {
        "prompts": len(examples),
        "question_ids": [ex.id for ex in examples],
        "method": config.method,
        "strategy": config.rollout.strategy,
        "rewards_seen": sorted({r for t in trees for r in t.rewards().values()}),
        # the estimators' settings as they ran (e.g. a `--set algorithm.portool.gamma=1.0` ablation says so here)
        "algorithm": base.model_dump(mode="json"),
        "rollout": episode_metrics(trees, examples),
        "estimators": {},
    }
    for name in estimators:
        adv = compute_advantages(base.model_copy(update={"method": name}), batch, trees, Signals())
        batch.advantages, batch.loss_mask = adv.advantages, adv.loss_mask
        credits = step_credits(trees, examples, batch)
        entry: dict[str, Any] = {"by_kind": credit_by_step_kind(credits)}
        for label, outcomes in (
            ("failing", ("wrong", "unfinished")),
            ("all", ("correct", "wrong", "unfinished")),
        ):
            diffs = call_minus_answer(credits, outcomes)
            entry[f"call_minus_answer/{label}"] = {
                "questions": len(diffs),
                "mean_low_high": list(mean_interval(diffs)) if diffs else None,
            }
        counts = Counter(f"credit/{c.kind}_step" for c in credits)
        counts.update(f"credit/{c.kind}_step/{c.outcome}" for c in credits)
        entry["steps"] = dict(sorted(counts.items()))  # the number of steps behind each by_kind mean
        result["estimators"][name] = entry
    return result


def format_probe(result: dict[str, Any]) -> str:
    """The probe's result as a markdown table (rows: step kind / outcome; columns: estimators)."""
    names = list(result["estimators"])
    r = result["rollout"]
    lines = [
        f"{result['prompts']} training prompts of a {result['method']} run ({result['strategy']} rollouts, rewards "
        f"seen {result['rewards_seen']}), {int(r['episode/count'])} trajectories: accuracy {r['accuracy']:.3f}, "
        f"{r['episode/tool_calls']:.2f} tool calls per trajectory",
        "",
        "| mean step advantage | steps | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    first = result["estimators"][names[0]]
    keys = sorted({k for e in result["estimators"].values() for k in e["by_kind"]})
    for key in keys:
        label, n = key.removeprefix("credit/"), first["steps"].get(key, 0)
        cells = [
            f"{e['by_kind'][key]:+.3f}" if key in e["by_kind"] else "" for e in result["estimators"].values()
        ]
        lines.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    for label in ("failing", "all"):
        cells, questions = [], 0
        for e in result["estimators"].values():
            d = e[f"call_minus_answer/{label}"]
            questions = d["questions"]
            iv = d["mean_low_high"]
            if iv is None:
                cells.append("")
            elif questions < 2:
                cells.append(f"{iv[0]:+.3f} [n/a: one question]")
            else:
                cells.append(f"{iv[0]:+.3f} [{iv[1]:+.3f}, {iv[2]:+.3f}]")
        lines.append(
            f"| call - answer, {label} trajectories (per question) | {questions} q | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)
