"""carl-segment warm-up pieces: canonicalised boundary states, the gate, a short run on the tiny model."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.models.heads import BoundaryValueHead
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.batch import build_batch, segment_spans
from agentcredit.train.sft import demonstrations
from agentcredit.train.signals import values_at
from agentcredit.train.warmup import (
    GATE,
    Pair,
    WarmupSettings,
    boundary_features,
    canonical,
    train_head_on_features,
    warmup,
)


def test_canonical_replaces_only_the_prompt():
    tree = RolloutTree(Segment([1, 2, 3], "old prompt", role="prompt"))
    leaf = tree.add_path([Segment([5], role="policy", logprobs=[-1.0]), Segment([6], role="observation")])
    tree.set_reward(leaf, 1.0)
    new = canonical(tree, [9, 9], "new prompt")
    assert new.flatten(leaf).token_ids == [9, 9, 5, 6]
    assert new.rewards() == tree.rewards() and new.parents == tree.parents


def test_warmup_runs_end_to_end_and_reports_the_gate(fitted_codefence):
    model, tokenizer = fitted_codefence
    model = copy.deepcopy(model)
    config = load_config("carl-segment-arith-tools", SMALL)
    head = BoundaryValueHead(model.config.hidden_size)
    before = copy.deepcopy(head.state_dict())
    examples = list(EXAMPLES) * 2  # four questions: three train, one held out
    settings = WarmupSettings(tier_samples=2, head_epochs=5, steps=3, pairs_per_step=8, holdout_fraction=0.25)
    lines = []
    report = warmup(model, head, tokenizer, config, examples, settings, log=lines.append)
    assert set(report.tiers.values()) <= {"tier1", "tier2"}
    assert sum(report.buckets.values()) > 0 and len(report.losses) == 5 + 3  # head epochs, then joint steps
    assert set(GATE) <= set(report.gate)  # computed on the held-out question (AUC is NaN with one tier)
    assert not torch.equal(before["fc2.weight"], head.state_dict()["fc2.weight"])  # the critic trained
    assert "auc" in report.table() and any("warm-up step" in line for line in lines)
    assert any("critic head epoch" in line for line in lines)


def demonstration_batch(tokenizer):
    """The training batch of the two scripted demonstrations (carl-segment's codefence episodes)."""
    config = load_config("carl-segment-arith-tools", SMALL)
    env = build_environment(config)
    try:
        trees = demonstrations(env, tokenizer, EXAMPLES, config.protocol.name)
    finally:
        env.close()
    return build_batch(trees, pad_id=tokenizer.pad_token_id)


def test_cached_boundary_features_are_what_the_value_head_reads(fitted_codefence):
    """Head-only epochs train on cached features; V from them must equal V from the full forward (values_at)."""
    model, tokenizer = fitted_codefence
    batch = demonstration_batch(tokenizer)
    positions = {}
    for traj in batch.trajectories:
        for row, first, _ in segment_spans(batch, traj):
            positions.setdefault(row, []).append(first)
    head = BoundaryValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.fc2.weight, std=0.1)  # a non-constant head, so the comparison means something
    model.eval()
    features = boundary_features(model, batch, positions)
    with torch.no_grad():
        direct = values_at(model, head, batch, positions)
        for key, value in direct.items():
            assert float(head(features[key])) == pytest.approx(float(value), abs=1e-5)


def test_head_epochs_fit_the_targets_bucket_balanced(fitted_codefence):
    model, tokenizer = fitted_codefence
    batch = demonstration_batch(tokenizer)
    pairs = [
        Pair(row, first, target=float(j % 2), bucket=f"b{j % 2}", is_s0=k == 0)
        for j, traj in enumerate(batch.trajectories)
        for k, (row, first, _) in enumerate(segment_spans(batch, traj))
    ]
    head = BoundaryValueHead(model.config.hidden_size)
    losses = train_head_on_features(
        model, head, batch, pairs, WarmupSettings(head_epochs=60, feature_lr=1e-2), log=lambda _: None
    )
    assert losses[0] == pytest.approx(0.25, abs=1e-6)  # V = 0.5 at init, targets 0/1: balanced MSE 0.25
    assert losses[-1] < 0.05
