"""summarize / critic_metrics by hand, and boundary values against a direct forward pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentcredit.eval.evaluate import boundary_values, critic_metrics, episode_records, summarize
from agentcredit.models.heads import BoundaryValueHead
from agentcredit.tasks import Example


def _record(id_, correct, tool_calls, tier=None, em=None, tokens=10, values=None, reward=None):
    r = {
        "id": id_,
        "correct": float(correct),
        "em": float(correct if em is None else em),
        "f1": float(correct),
        "substring_em": float(correct),
        "tool_calls": tool_calls,
        "policy_tokens": tokens,
        "reward": float(correct if reward is None else reward),
        "answer": "x",
        "info": {"tier": tier} if tier else {},
    }
    if values is not None:
        r["values"], r["v_s0"] = values, values[0]
    return r


def test_summarize_by_hand_with_both_tier_groupings():
    records = [
        _record("a", 1, 0, tier="easy", tokens=10),
        _record("b", 0, 2, tier="easy", tokens=20),
        _record("c", 1, 1, tier="hard", tokens=30),
        _record("d", 0, 0, tier="hard", tokens=40),
    ]
    out = summarize(records, tiers={"a": "tier2", "b": "tier2", "c": "tier2", "d": "tier1"})
    assert out["accuracy"] == 0.5 and out["tool_calls"] == 0.75 and out["policy_tokens"] == 25
    assert out["tool_call_rate"] == 0.5  # b and c called a tool
    assert out["easy/tool_call_rate"] == 0.5 and out["hard/accuracy"] == 0.5
    # Tier 2 = a, b, c: EM 2/3, tool rate 2/3 (b, c); Tier 1 = d
    assert out["tier2/em"] == pytest.approx(2 / 3) and out["tier2/tool_call_rate"] == pytest.approx(2 / 3)
    assert out["tier1/episodes"] == 1 and out["tier1/tool_calls"] == 0
    with pytest.raises(ValueError, match="no tier label"):
        summarize(records, tiers={"a": "tier1"})
    with pytest.raises(ValueError, match="no episodes"):
        summarize([])


def test_summarize_per_hop_count():
    records = [_record(i, c, 1) for i, c in (("a", 1), ("b", 0), ("c", 1), ("d", 1))]
    for record, hops in zip(records, (1, 1, 3, 3), strict=True):
        record["info"] = {"hops": hops}
    out = summarize(records)
    assert out["hop1/accuracy"] == 0.5 and out["hop3/accuracy"] == 1.0 and out["hop3/episodes"] == 2
    assert "hop2/accuracy" not in out


def test_critic_metrics_by_hand():
    records = [
        _record("q1", 1, 0, values=[0.9, 0.95]),  # Tier 2
        _record("q2", 0, 1, values=[0.2, 0.4]),  # Tier 1
        _record("q3", 1, 1, values=[0.6, 0.8]),  # Tier 2
        _record("q4", 0, 0, values=[0.65]),  # Tier 1
    ]
    tiers = {"q1": "tier2", "q2": "tier1", "q3": "tier2", "q4": "tier1"}
    out, table = critic_metrics(records, tiers=tiers)
    # AUC: Tier 2 scores {0.9, 0.6} vs Tier 1 {0.2, 0.65}: pairs 0.9>0.2, 0.9>0.65, 0.6>0.2, 0.6<0.65 -> 3/4
    assert out["critic/auc_v_s0"] == pytest.approx(0.75)
    # bins: 0.2 -> [0.2,0.3) outcome 0; 0.6, 0.65 -> [0.6,0.7) outcomes 1, 0; 0.9 -> [0.9,1] outcome 1
    # ECE(mean) = 1/4*0.2 + 2/4*|0.5-0.625| + 1/4*0.1 = 0.05 + 0.0625 + 0.025
    assert out["critic/ece"] == pytest.approx(0.1375)
    # midpoints 0.25, 0.65, 0.95: 1/4*0.25 + 2/4*0.15 + 1/4*0.05
    assert out["critic/ece_midpoint"] == pytest.approx(0.0625 + 0.075 + 0.0125)
    assert out["critic/brier"] == pytest.approx((0.01 + 0.04 + 0.16 + 0.4225) / 4)
    # EV over the 7 boundary states against each episode's reward
    v = np.array([0.9, 0.95, 0.2, 0.4, 0.6, 0.8, 0.65])
    r = np.array([1, 1, 0, 0, 1, 1, 0.0])
    assert out["critic/explained_variance"] == pytest.approx(1 - (r - v).var() / r.var())
    assert out["tier2/v_s0_mean"] == pytest.approx(0.75) and out["critic/clipped_fraction"] == 0
    assert sum(row["count"] for row in table) == 4


def test_critic_metrics_clips_token_critic_values_and_needs_values():
    out, _ = critic_metrics([_record("a", 1, 0, values=[1.4]), _record("b", 0, 0, values=[-0.3])])
    assert out["critic/clipped_fraction"] == 1.0 and out["critic/brier"] == 0.0
    assert "critic/auc_v_s0" not in out  # no tiers, no AUC
    with pytest.raises(ValueError, match="carry no critic values"):
        critic_metrics([_record("a", 1, 0)])


def test_boundary_values_match_a_direct_forward_pass(tiny, tree):
    model, tokenizer = tiny
    torch.manual_seed(1)
    head = BoundaryValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.fc2.weight, std=0.5)  # a non-constant critic
    values = boundary_values(model, head, [tree], pad_id=tokenizer.pad_token_id)
    assert [len(v) for v in values] == [2, 1]  # invoke + commit; direct commit
    leaves = tree.leaves()
    for leaf, traj_values in zip(leaves, values, strict=True):
        path = tree.path(leaf)
        ids, k = [], 0
        for node in path:
            seg = tree.segment(node)
            if seg.role == "policy":
                # V(b_k): the state before this segment's first token = hidden state of the last context token
                with torch.no_grad():
                    hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
                    expected = float(head(hidden))
                assert traj_values[k] == pytest.approx(expected, abs=1e-5)
                k += 1
            ids += seg.token_ids
    # both episodes start from the same prompt: the same V(s0)
    assert values[0][0] == pytest.approx(values[1][0], abs=1e-6)


def test_episode_records_attach_values_and_check_lengths(tree):
    example = Example(
        id="q", task="arith-tools", question="what is 12*7?", answers=["84"], info={"metric": "numeric"}
    )
    records = episode_records([tree], [example], values=[[0.3, 0.7], [0.3]])
    assert [r["v_s0"] for r in records] == [0.3, 0.3] and records[0]["values"] == [0.3, 0.7]
    assert records[0]["correct"] == 1.0 and records[0]["tool_calls"] == 1 and records[1]["correct"] == 0.0
    with pytest.raises(ValueError, match="value lists"):
        episode_records([tree], [example], values=[[0.3]])
    with pytest.raises(ValueError, match="trees for"):
        episode_records([tree], [])
    assert not math.isnan(records[0]["f1"])
