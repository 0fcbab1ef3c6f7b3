"""Evaluation: run the policy on a task through the same engine, protocol and tools as training, and score it.

Greedy decoding by default (one episode per question); ``samples=k`` with a temperature gives k sampled episodes
per question. Every episode is kept as a JSON-able record (segments, tool calls, observations, reward) so it can be
written as JSONL and viewed with ``agentcredit view``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentcredit.environment import Environment, example_metric
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.tasks.scoring import exact_match, f1_score, score, substring_match


def episode_records(trees: Sequence[RolloutTree], examples: Sequence[Example]) -> list[dict[str, Any]]:
    """One record per root-to-leaf episode: question, golds, answer, scores, tool calls, segments."""
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
                    "correct": float(score(answer, example.answers, metric=metric))
                    if answer is not None
                    else 0.0,
                    "em": exact_match(answer, example.answers),
                    "f1": f1_score(answer, example.answers),
                    "substring_em": substring_match(answer, example.answers),
                    "tool_calls": sum(len(s.info.get("calls", [])) for s in policy),
                    "policy_tokens": sum(len(s) for s in policy),
                    "finish": leaf_info.get("finish"),
                    "segments": [
                        {
                            "node": i,
                            "role": tree.segment(i).role,
                            "kind": tree.segment(i).kind,
                            "text": tree.segment(i).text,
                            "transient": tree.segment(i).transient,
                            "tokens": len(tree.segment(i)),
                            "calls": tree.segment(i).info.get("calls", []),
                        }
                        for i in path
                    ],
                }
            )
    return records


def summarize(records: Sequence[dict[str, Any]], *, tiers: dict[str, str] | None = None) -> dict[str, float]:
    """Accuracy, EM, F1, substring EM, tool calls and tokens per episode; per tier when tiers are known.

    ``tiers`` maps example id -> tier label (e.g. carl-segment's "tier1"/"tier2"); by default an example's own
    ``info['tier']`` is used (arith-tools: easy / hard).
    """
    if not records:
        raise ValueError("no episodes to summarise")
    out: dict[str, float] = {"episodes": float(len(records))}
    for key in ("correct", "em", "f1", "substring_em", "tool_calls", "policy_tokens", "reward"):
        out[key if key != "correct" else "accuracy"] = float(np.mean([r[key] for r in records]))
    out["tool_call_rate"] = float(np.mean([r["tool_calls"] > 0 for r in records]))
    out["answered"] = float(np.mean([r["answer"] is not None for r in records]))
    labels = [(tiers or {}).get(r["id"], r["info"].get("tier")) for r in records]
    for tier in sorted({t for t in labels if t}):
        sel = [r for r, t in zip(records, labels, strict=True) if t == tier]
        out[f"{tier}/accuracy"] = float(np.mean([r["correct"] for r in sel]))
        out[f"{tier}/tool_call_rate"] = float(np.mean([r["tool_calls"] > 0 for r in sel]))
        out[f"{tier}/tool_calls"] = float(np.mean([r["tool_calls"] for r in sel]))
        out[f"{tier}/episodes"] = float(len(sel))
    return out


def run_episodes(
    model: Any,
    tokenizer: Any,
    env: Environment,
    examples: Sequence[Example],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    max_episode_tokens: int = 1024,
    max_turns: int | None = None,
    max_batch: int = 64,
    seed: int = 0,
) -> list[RolloutTree]:
    """Episodes of ``model`` on ``examples`` (greedy by default), one tree per question."""
    import torch

    from agentcredit.rollout.backend import HFBackend
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine
    from agentcredit.rollout.sampling import SamplingParams
    from agentcredit.rollout.strategies import independent

    if samples > 1 and temperature == 0.0:
        raise ValueError("samples > 1 with greedy decoding would repeat one episode; set a temperature")
    config = EngineConfig(
        sampling=SamplingParams(temperature=temperature, top_p=top_p),
        max_segment_tokens=max_new_tokens,
        max_episode_tokens=max_episode_tokens,
        max_turns=max_turns,
        seed=seed,
        max_batch=max_batch,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    engine = RolloutEngine(HFBackend(model, pad_token_id=pad), tokenizer, env.protocol, env.tools, config)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        trees = engine.run(list(examples), independent(samples), env.reward)
    model.train(was_training)
    return trees


def evaluate(
    model: Any, tokenizer: Any, env: Environment, examples: Sequence[Example], **kwargs: Any
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(summary, episode records)`` of ``model`` on ``examples``; kwargs go to :func:`run_episodes`."""
    tiers = kwargs.pop("tiers", None)
    trees = run_episodes(model, tokenizer, env, examples, **kwargs)
    records = episode_records(trees, examples)
    return summarize(records, tiers=tiers), records
