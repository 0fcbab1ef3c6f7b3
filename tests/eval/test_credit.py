"""Per-token credit dumps: alignment of tokens, advantages and the loss mask; the trainer's dump hook."""

from __future__ import annotations

import json

import pytest
import torch

from agentcredit.tasks import Example
from agentcredit.train.batch import build_batch
from agentcredit.train.credit_records import credit_records, decode_tokens


def _example() -> Example:
    return Example(
        id="q7", task="arith-tools", question="what is 12*7?", answers=["84"], info={"metric": "numeric"}
    )


def test_credit_records_align_tokens_with_advantages(tiny, tree):
    _, tokenizer = tiny
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    # advantage = node id + column / 1000, so each value says where it came from; drop one token from the loss
    cols = torch.arange(batch.input_ids.shape[1]).float()
    batch.advantages = torch.where(
        batch.policy_mask, batch.segment_ids.float() + cols / 1000, torch.zeros(())
    )
    first_policy = batch.policy_mask[0].nonzero()[0, 0]
    batch.loss_mask = batch.policy_mask.clone()
    batch.loss_mask[0, first_policy] = False
    records = credit_records([tree], batch, [_example()], tokenizer, step=3, method="grpo")
    assert len(records) == 2 and records[0]["id"] == "q7" and records[0]["step"] == 3
    first = records[0]
    roles = [s["role"] for s in first["segments"]]
    assert roles == ["prompt", "policy", "observation", "policy"]
    assert "tokens" not in first["segments"][0]  # the prompt is text only
    obs = first["segments"][2]
    assert "advantages" not in obs and "".join(obs["tokens"]) == obs["text"]
    for seg in (s for s in first["segments"] if s["role"] == "policy"):
        node = tree.segment(seg["node"])
        assert len(seg["tokens"]) == len(seg["advantages"]) == len(seg["in_loss"]) == len(node)
        assert all(int(a) == seg["node"] for a in seg["advantages"])  # came from this segment's positions
        assert seg["advantages"] == sorted(seg["advantages"])  # in temporal order
        assert "".join(seg["tokens"]) == seg["text"]
    assert first["segments"][1]["in_loss"][0] is False and all(first["segments"][1]["in_loss"][1:])
    assert first["tool_calls"] == 1 and first["reward"] == 1.0 and records[1]["answer"] == "86"


def test_credit_records_reject_misaligned_inputs(tiny, tree):
    _, tokenizer = tiny
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="trees for"):
        credit_records([tree], batch, [_example(), _example()], tokenizer)
    batch.advantages = batch.advantages[:, :3]
    with pytest.raises(ValueError, match="after compute_advantages"):
        credit_records([tree], batch, [_example()], tokenizer)


def test_decode_tokens_one_by_one(tiny):
    _, tokenizer = tiny
    ids = tokenizer("a b<|im_end|>", add_special_tokens=False)["input_ids"]
    assert decode_tokens(tokenizer, ids)[-1] == "<|im_end|>" and decode_tokens(tokenizer, []) == []


def test_trainer_dumps_episodes_every_n_steps(tiny, tiny_overrides, tmp_path):
    from agentcredit.config import load_config
    from agentcredit.train.trainer import Trainer

    cfg = load_config(
        "grpo-arith-tools",
        [
            *tiny_overrides,
            "rollout.prompts_per_step=2",
            "rollout.n=2",
            "train.steps=2",
            "train.dump_episodes_every=2",
            "train.save_every=0",
            "algorithm.kl_coef=0",
        ],
    )
    trainer = Trainer(
        cfg, run_dir=tmp_path / "run", model=tiny[0].__class__(tiny[0].config), tokenizer=tiny[1]
    )
    try:
        trainer.train(progress=False)
    finally:
        trainer.close()
    dumps = sorted((tmp_path / "run" / "episodes").glob("*.jsonl"))
    assert [p.name for p in dumps] == ["step-000002.jsonl"]  # every 2 steps: only step 2
    records = [json.loads(line) for line in dumps[0].read_text().splitlines()]
    assert len(records) == 4 and {r["step"] for r in records} == {2} and records[0]["method"] == "grpo"
    for r in records:
        policy = [s for s in r["segments"] if s["role"] == "policy"]
        assert policy and all(len(s["tokens"]) == len(s["advantages"]) for s in policy)
        # GRPO: one advantage for every token of a trajectory
        assert len({a for s in policy for a in s["advantages"]}) == 1
