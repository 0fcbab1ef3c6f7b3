"""Trajectory data model, the multi-turn rollout engine and tree rollout strategies.

    backend = HFBackend(model)
    engine = RolloutEngine(backend, tokenizer, get_protocol("codefence"), tools, EngineConfig(...))
    trees = engine.run(examples, independent(8), reward_fn)       # or entropy_guided(n0, n), step_forks(n, f)

The data model is imported eagerly; the engine, backend and strategies (which import torch and transformers)
load on first use, so ``from agentcredit.rollout import RolloutTree`` stays cheap for the credit functions.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentcredit.rollout.tree import FlatSequence, Node, RolloutTree, Segment

_LAZY = {
    "Backend": "backend",
    "BackendStats": "backend",
    "HFBackend": "backend",
    "SegmentBackend": "backend",
    "SegmentOutput": "backend",
    "SegmentRequest": "backend",
    "VLLMBackend": "vllm_backend",
    "EpisodeLimits": "episode",
    "EpisodeMachine": "episode",
    "EngineConfig": "engine",
    "EngineStats": "engine",
    "Job": "engine",
    "JobResult": "engine",
    "PlanContext": "engine",
    "RolloutEngine": "engine",
    "Strategy": "engine",
    "SamplingParams": "sampling",
    "sample_tokens": "sampling",
    "EntropyGuided": "strategies",
    "Independent": "strategies",
    "dup_and_samp": "strategies",
    "entropy_guided": "strategies",
    "from_rollout_config": "strategies",
    "independent": "strategies",
    "merge_identical_siblings": "strategies",
    "select_forks": "strategies",
    "StepForks": "strategies",
    "step_forks": "strategies",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"agentcredit.rollout.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'agentcredit.rollout' has no attribute {name!r}")


__all__ = ["FlatSequence", "Node", "RolloutTree", "Segment", *_LAZY]
