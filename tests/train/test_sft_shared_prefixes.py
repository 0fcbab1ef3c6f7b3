"""SFT forwards a prefix its demonstrations share (the system prompt) once, as the RL update does (issue 13).

Before, SFT padded and forwarded every row from its first token; on kb-multihop in PORTool's JSON format, whose
system prompt is over 1,000 tokens, that made the study's start cost hours on 2 cores.
"""

from __future__ import annotations

import copy

import pytest
from train_helpers import SMALL, tiny_demonstrations

from agentcredit.config import load_config
from agentcredit.credit import aggregation_weights
from agentcredit.models.loading import load_base_model
from agentcredit.models.scoring import score_tokens
from agentcredit.train.batch import build_batch
from agentcredit.train.sft import sft


def test_sft_forwards_the_shared_prompt_once_for_the_row_by_row_loss():
    config = load_config("grpo-arith-tools", SMALL)
    model, tokenizer = load_base_model("tiny", seed=0)
    trees = tiny_demonstrations(config, tokenizer)
    batch = build_batch(trees, pad_id=tokenizer.pad_token_id)
    lengths = batch.attention_mask.sum(-1).tolist()
    prompt = min(batch.policy_mask[r].nonzero()[0].item() for r in range(batch.num_rows))
    assert batch.num_rows >= 2 and prompt > 20  # rows that share at least the system prompt

    # the reference: every row padded and forwarded on its own, token-mean NLL over the policy tokens
    weights = aggregation_weights(batch.policy_mask, "token-mean").float()
    reference = score_tokens(
        copy.deepcopy(model), batch.input_ids, batch.attention_mask, batch.policy_mask, with_entropy=False
    )
    expected = float(-(reference.logprobs * weights).sum())

    fed = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: fed.append(int(kw["input_ids"].numel())), with_kwargs=True
    )
    losses = []
    try:
        sft(
            model,
            trees,
            pad_id=tokenizer.pad_token_id,
            epochs=1,
            batch_trajectories=2,
            lr=0.0,
            on_step=lambda _step, loss: losses.append(loss),
        )
    finally:
        hook.remove()
    assert losses == [pytest.approx(expected, rel=1e-5)]
    # one packed forward: the shared prefix once, no padding
    assert len(fed) == 1 and fed[0] <= sum(lengths) - prompt
