"""carl-segment warm-up pieces: canonicalised boundary states, the gate, a short run on the tiny model."""

from __future__ import annotations

import copy

import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.models.heads import BoundaryValueHead
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.warmup import GATE, WarmupSettings, canonical, warmup


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
    settings = WarmupSettings(tier_samples=2, steps=3, pairs_per_step=8, holdout_fraction=0.25)
    lines = []
    report = warmup(model, head, tokenizer, config, examples, settings, log=lines.append)
    assert set(report.tiers.values()) <= {"tier1", "tier2"}
    assert sum(report.buckets.values()) > 0 and len(report.losses) == 3
    assert set(GATE) <= set(report.gate)  # computed on the held-out question (AUC is NaN with one tier)
    assert not torch.equal(before["fc2.weight"], head.state_dict()["fc2.weight"])  # the critic trained
    assert "auc" in report.table() and any("warm-up step" in line for line in lines)
