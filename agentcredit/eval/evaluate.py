"""Evaluation: run the policy on a task through the same engine, protocol and tools as training, and score it.

Greedy decoding by default (one episode per question); ``samples=k`` with a temperature gives k sampled episodes
per question. Every episode is kept as a JSON-able record (segments, tool calls, observations, reward) so it can be
written as JSONL and viewed with ``agentcredit view``.

With a value head (a critic run, or a warmed-up carl-segment model) every record also carries V at each policy
segment's boundary state (``values``; ``v_s0`` = V(s_0), the state before the first policy token), and
:func:`critic_metrics` gives the carl-segment §6 critic diagnostics: AUC of V(s_0) between Tier 1 and Tier 2,
ECE over 10 equal-width bins, Brier score, reliability table and explained variance over all boundary states.

An episode in which a tool could not run (``infra=True`` tool results: the sandbox or the corpus was unavailable)
says nothing about the model: its record lists them under ``infra_failures``, and the summary counts such episodes
as ``infra_failures`` and leaves them out of every other number (accuracy included). When every episode is one,
there is nothing to score and :func:`summarize` raises :class:`~agentcredit.tools.base.ToolUnavailableError`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentcredit.config import MICRO_BATCH_TOKENS
from agentcredit.environment import Environment
from agentcredit.rewards import example_metric
from agentcredit.rollout.infra import infra_failures
from agentcredit.rollout.run import run_episodes
from agentcredit.rollout.tree import RolloutTree, segment_step_reward, step_reward_fields
from agentcredit.tasks import Example
from agentcredit.tasks.bfcl import bfcl_reward
from agentcredit.tasks.scoring import exact_match, f1_score, score, substring_match
from agentcredit.tools.base import ToolUnavailableError

logger = logging.getLogger(__name__)


def episode_records(
    trees: Sequence[RolloutTree],
    examples: Sequence[Example],
    *,
    values: Sequence[Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """One record per root-to-leaf episode: question, golds, answer, scores, tool calls, segments.

    ``values`` (from :func:`boundary_values`, same trajectory order) adds ``values`` (V(b_k) per policy segment)
    and ``v_s0`` to each record.
    """
    if len(trees) != len(examples):
        raise ValueError(f"episode_records: {len(trees)} trees for {len(examples)} examples")
    records = []
    for tree, example in zip(trees, examples, strict=True):
        for leaf, reward in tree.rewards().items():
            path = tree.path(leaf)
            leaf_info = tree.nodes[leaf].info
            answer = leaf_info.get("answer")
            policy = [tree.segment(i) for i in path if tree.segment(i).role == "policy"]
            metric = example_metric(example)
            records.append(
                {
                    "id": example.id,
                    "task": example.task,
                    "question": example.question,
                    "answers": example.answers,
                    "info": {
                        k: v for k, v in example.info.items() if isinstance(v, str | int | float | bool)
                    },
                    "answer": answer,
                    "reward": reward,
                    "correct": _correct(example, answer, metric),
                    # text metrics need gold texts (BFCL's questions have gold calls instead: 0 there)
                    "em": exact_match(answer, example.answers) if example.answers else 0.0,
                    "f1": f1_score(answer, example.answers) if example.answers else 0.0,
                    "substring_em": substring_match(answer, example.answers) if example.answers else 0.0,
                    "tool_calls": sum(len(s.info.get("calls", [])) for s in policy),
                    "policy_tokens": sum(len(s) for s in policy),
                    "finish": leaf_info.get("finish"),
                    "infra_failures": infra_failures(tree, leaf),  # tools that could not run: not scored
                    **step_reward_fields(tree, leaf),
                    "segments": [
                        {
                            "node": i,
                            "role": tree.segment(i).role,
                            "kind": tree.segment(i).kind,
                            "text": tree.segment(i).text,
                            "transient": tree.segment(i).transient,
                            "tokens": len(tree.segment(i)),
                            "calls": tree.segment(i).info.get("calls", []),
                            **segment_step_reward(tree, i),
                        }
                        for i in path
                    ],
                }
            )
    if values is not None:
        if len(values) != len(records):
            raise ValueError(f"episode_records: {len(values)} value lists for {len(records)} episodes")
        for record, v in zip(records, values, strict=True):
            record["values"] = [float(x) for x in v]
            record["v_s0"] = float(v[0]) if len(v) else None
    return records


def _correct(example: Example, answer: str | None, metric: str) -> float:
    """The episode's score by the example's own rule (BFCL's checker for ``bfcl`` examples, which also scores a
    missing answer: on an irrelevance question, saying nothing is right)."""
    if metric == "bfcl":
        return bfcl_reward(example, answer)
    return float(score(answer, example.answers, metric=metric)) if answer is not None else 0.0


def summarize(records: Sequence[dict[str, Any]], *, tiers: dict[str, str] | None = None) -> dict[str, float]:
    """Accuracy, EM, F1, substring EM, tool calls and tokens per episode; per tier when tiers are known.

    Tier groupings are reported side by side: the task's own (``info['tier']``, arith-tools: easy / hard), the
    hop count (``info['hops']``: ``hop1``, ``hop2``, ...) and ``tiers``, a map example id -> label (carl-segment's "tier1"/"tier2" from :func:`tier_labels`). For each
    tier: accuracy, EM, tool-call rate (fraction of episodes with >= 1 call, carl-segment.md §6), calls per episode.

    Episodes with infrastructure failures (a tool that could not run) are counted as ``infra_failures`` and left
    out of everything else; ``episodes`` counts the scored ones.
    """
    if not records:
        raise ValueError("no episodes to summarise")
    broken = [r for r in records if r.get("infra_failures")]
    records = [r for r in records if not r.get("infra_failures")]
    if not records:
        raise ToolUnavailableError(
            f"all {len(broken)} evaluation episodes hit a tool that could not run, so there is nothing to score; "
            f"first: {broken[0]['infra_failures'][0]}"
        )
    if broken:
        logger.warning(
            "evaluation: %d of %d episodes hit a tool that could not run; they are excluded from every metric "
            "(summary key infra_failures). First: %s",
            len(broken), len(broken) + len(records), broken[0]["infra_failures"][0],
        )  # fmt: skip
    out: dict[str, float] = {"episodes": float(len(records)), "infra_failures": float(len(broken))}
    for key in ("correct", "em", "f1", "substring_em", "tool_calls", "policy_tokens", "reward"):
        out[key if key != "correct" else "accuracy"] = float(np.mean([r[key] for r in records]))
    out["tool_call_rate"] = float(np.mean([r["tool_calls"] > 0 for r in records]))
    out["answered"] = float(np.mean([r["answer"] is not None for r in records]))
    groupings = [[r["info"].get("tier") for r in records]]
    # multi-hop tasks (kb-multihop, MuSiQue): per hop count, e.g. hop3/accuracy (GEAR's gain is on the hardest)
    groupings.append([f"hop{r['info']['hops']}" if r["info"].get("hops") else None for r in records])
    if tiers is not None:
        missing = sorted({r["id"] for r in records} - set(tiers))
        if missing:
            raise ValueError(f"summarize: no tier label for example(s) {missing[:5]}")
        groupings.append([tiers[r["id"]] for r in records])
    for labels in groupings:
        for tier in sorted({t for t in labels if t}):
            sel = [r for r, t in zip(records, labels, strict=True) if t == tier]
            out[f"{tier}/accuracy"] = float(np.mean([r["correct"] for r in sel]))
            out[f"{tier}/em"] = float(np.mean([r["em"] for r in sel]))
            out[f"{tier}/tool_call_rate"] = float(np.mean([r["tool_calls"] > 0 for r in sel]))
            out[f"{tier}/tool_calls"] = float(np.mean([r["tool_calls"] for r in sel]))
            out[f"{tier}/episodes"] = float(len(sel))
    return out


# What was evaluated, beside the metrics in eval's summary.json and train's eval_summary.json (the metrics' own
# names never collide with these: summarize's keys are scores, counts and "<tier>/..." / "critic/..." names).
SUMMARY_FIELDS = ("model", "method", "task", "split", "questions", "samples", "temperature", "seconds")
SUMMARY_TABLES = (
    "reliability",
    "tiers",
    "leaderboard",
    "bfcl_eval_version",
)  # the critic's reliability table, the tier labels, BFCL's leaderboard columns and checker version (None when absent)


def summary_file(metrics: dict[str, float], **fields: Any) -> dict[str, Any]:
    """One flat shape for ``agentcredit eval``'s ``summary.json`` and ``train``'s ``eval_summary.json``: what was
    evaluated (:data:`SUMMARY_FIELDS`), every metric at the top level, then :data:`SUMMARY_TABLES`."""
    unknown = sorted(set(fields) - set(SUMMARY_FIELDS) - set(SUMMARY_TABLES))
    clash = sorted(set(metrics) & (set(SUMMARY_FIELDS) | set(SUMMARY_TABLES)))
    if unknown or clash:
        raise ValueError(f"summary_file: unknown fields {unknown}, metrics named like fields {clash}")
    return {
        **{k: fields.get(k) for k in SUMMARY_FIELDS},
        **metrics,
        **{k: fields.get(k) for k in SUMMARY_TABLES},
    }


def summary_metrics(data: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of a summary file (:func:`summary_file`; files written before it nest them under
    ``metrics``), without the fields that say what was evaluated."""
    source = data["metrics"] if isinstance(data.get("metrics"), dict) else data
    skip = set(SUMMARY_FIELDS) | set(SUMMARY_TABLES)
    return {
        k: float(v)
        for k, v in source.items()
        if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
    }


# ------------------------------------------------------------------------------------------------ critic
def boundary_values(
    model: Any,
    value_head: Any,
    trees: Sequence[RolloutTree],
    *,
    pad_id: int = 0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> list[list[float]]:
    """V(b_k) at every policy segment's boundary state, per trajectory (trees in order, leaves in order).

    b_k is the context a policy segment was generated from; with the scoring alignment of
    :mod:`agentcredit.models.scoring` its value sits at the segment's first token. b_0 is the prompt, so the
    first value is V(s_0). Transient states (carl-segment's raw tool output) are included through the
    trainer's own batch layout, so these are exactly the states the critic is trained on.
    """
    import torch

    from agentcredit.train.batch import build_batch, segment_spans
    from agentcredit.train.signals import values_at

    batch = build_batch(trees, pad_id=pad_id)
    spans = [segment_spans(batch, traj) for traj in batch.trajectories]
    wanted: dict[int, list[int]] = {}
    for traj_spans in spans:
        for row, first, _ in traj_spans:
            wanted.setdefault(row, []).append(first)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        found = values_at(model, value_head, batch, wanted, autocast=autocast, max_tokens=max_tokens)
    model.train(was_training)
    return [[float(found[(row, first)]) for row, first, _ in traj_spans] for traj_spans in spans]


def critic_metrics(
    records: Sequence[dict[str, Any]], *, tiers: dict[str, str] | None = None, bins: int = 10
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """carl-segment §6 critic diagnostics from records that carry ``values``; returns (scalars, reliability table).

    * ``critic/auc_v_s0``: ROC-AUC of V(s_0) with Tier 2 as the positive class, one score per question (the mean
      over its episodes; greedy evaluation has one). Needs ``tiers``.
    * ``critic/ece`` (conf_b = mean V in the bin, carl-segment.md [R]) and ``critic/ece_midpoint`` (conf_b = bin midpoint,
      the paper's Tab. 11 variant), ``critic/brier``, the reliability table: V(s_0) of every episode against its
      0/1 outcome. A token critic (PPO/TIPS) is unbounded, so its V is clipped to [0, 1] for these three (the
      outcome reward of these tasks lies in [0, 1]); ``critic/clipped_fraction`` says how often that bit.
    * ``critic/explained_variance``: EV = 1 - Var(R - V) / Var(R) over all boundary states, R the episode reward.

    Episodes with infrastructure failures (``infra_failures``) are left out, as in :func:`summarize`.
    """
    from agentcredit.credit.metrics import (
        auc,
        brier_score,
        calibration_error,
        explained_variance,
        reliability_table,
    )

    records = [r for r in records if not r.get("infra_failures")]
    with_values = [r for r in records if r.get("values")]
    if len(with_values) != len(records):
        raise ValueError(
            f"critic_metrics: {len(records) - len(with_values)} of {len(records)} episodes carry no critic values"
        )
    v0 = np.array([r["v_s0"] for r in records], dtype=np.float64)
    outcome = np.array([r["correct"] for r in records], dtype=np.float64)
    clipped = np.clip(v0, 0.0, 1.0)
    table = reliability_table(clipped, outcome, bins)
    all_v = [v for r in records for v in r["values"]]
    all_r = [r["reward"] for r in records for _ in r["values"]]
    out = {
        "critic/v_s0_mean": float(v0.mean()),
        "critic/ece": calibration_error(table, confidence="mean"),
        "critic/ece_midpoint": calibration_error(table, confidence="midpoint"),
        "critic/brier": brier_score(clipped, outcome),
        "critic/clipped_fraction": float(np.mean(clipped != v0)),
        "critic/explained_variance": explained_variance(all_v, all_r),
        "critic/boundary_states": float(len(all_v)),
    }
    if tiers is not None:
        per_question: dict[str, list[float]] = {}
        for r in records:
            per_question.setdefault(r["id"], []).append(r["v_s0"])
        ids = sorted(per_question)
        scores = [float(np.mean(per_question[i])) for i in ids]
        labels = [1.0 if tiers[i] == "tier2" else 0.0 for i in ids]
        out["critic/auc_v_s0"] = auc(scores, labels)
        for tier in ("tier1", "tier2"):
            sel = [s for s, i in zip(scores, ids, strict=True) if tiers[i] == tier]
            out[f"{tier}/v_s0_mean"] = float(np.mean(sel)) if sel else float("nan")
    return out, table


def require_all_scored(summary: dict[str, float], what: str) -> None:
    """Stop when an evaluation left episodes out because a tool could not run (``infra_failures``).

    ``agentcredit eval`` reports the count; a comparison (a demo's before/after table, a study's arms, a run's
    held-out curve) must not set numbers measured on different questions side by side, so it stops instead.
    """
    if summary.get("infra_failures"):
        from agentcredit.tools.base import ToolUnavailableError

        raise ToolUnavailableError(
            f"{what}: {int(summary['infra_failures'])} episode(s) hit a tool that could not run, so the "
            "evaluation would not cover every question; fix the tool and run again (or resume)"
        )


def rollout_caps(config: Any) -> dict[str, int | None]:
    """The engine caps of ``config.rollout`` as :func:`~agentcredit.rollout.run.run_episodes` keywords: evaluation decodes under the same
    token and turn limits as training."""
    r = config.rollout
    return {
        "max_new_tokens": r.max_new_tokens,
        "max_episode_tokens": r.max_episode_tokens,
        "max_turns": r.max_turns,
        "max_batch": r.max_batch,
    }


def evaluate(
    model: Any,
    tokenizer: Any,
    env: Environment,
    examples: Sequence[Example],
    *,
    value_head: Any = None,
    critic_model: Any = None,
    tiers: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(summary, episode records)`` of ``model`` on ``examples``; kwargs go to :func:`~agentcredit.rollout.run.run_episodes`.

    With a ``value_head`` the records carry V at every boundary and the summary the :func:`critic_metrics`
    scalars (AUC of V(s_0) only when ``tiers`` are given). The head reads ``critic_model``'s hidden states when
    the critic is a separate model (``algorithm.critic_model='separate'``), else the policy's.
    """
    trees = run_episodes(model, tokenizer, env, examples, **kwargs)
    values = None
    if value_head is not None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        values = boundary_values(critic_model or model, value_head, trees, pad_id=pad)
    records = episode_records(trees, examples, values=values)
    summary = summarize(records, tiers=tiers)
    if value_head is not None:
        summary.update(critic_metrics(records, tiers=tiers)[0])
    return summary, records
