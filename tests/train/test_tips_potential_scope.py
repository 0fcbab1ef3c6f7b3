"""TIPS's potential split into format and answer tokens, and ``potential_scope`` (issues 31, 48).

The released code scores ``<answer>X</answer>`` right after the state (``full``); a policy that opens every turn
with ``<think>`` gives the tag itself a low probability there, so Phi measures that habit more than what the state
says about the answer (72% of Phi(S_0) on the pinned step). The split shows it. ``answer_only`` (the tag forced into
the context, Eq. 15-16's p(A | S) and App. H's ``teacher(context + a)[-len(a):]``) removes it and is the default:
the paper wins over the released code.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
from train_helpers import EXAMPLES, METHODS, SMALL

from agentcredit.config import load_config
from agentcredit.credit.methods.tips import answer_token_span, tips_potential_terms
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.tree import RolloutTree
from agentcredit.train.batch import build_batch
from agentcredit.train.signals import score_continuations, segment_contexts
from agentcredit.train.trainer import Trainer

PIN = Path(__file__).parent / "data" / "pinned_steps.json"


def _tips_batch():
    trees = [RolloutTree.from_dict(t) for t in json.loads(PIN.read_text())["tips"]["trees"]]
    return trees, build_batch(trees)


def test_split_adds_up_and_answer_only_scores_the_answer_alone():
    model, tokenizer = load_base_model("tiny", seed=0)
    trees, batch = _tips_batch()
    by_id = {e.id: e for e in EXAMPLES}
    answers = [by_id[trees[t.tree].prompt_id].answers for t in batch.trajectories]

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(a):
        return f"<answer>{a}</answer>"

    score, contexts = partial(score_continuations, model), segment_contexts(batch)
    full = tips_potential_terms(score, contexts, answers, encode, render, scope="full")
    only = tips_potential_terms(score, contexts, answers, encode, render)
    assert only.scope == "answer_only"  # the paper's reading is the default
    for j, traj in enumerate(batch.trajectories):
        assert len(answers[j]) == 1  # one alias: lse over one alias is its summed log-prob
        for k in range(len(traj.policy_nodes)):
            assert full.potentials[j][k] == pytest.approx(full.format[j][k] + full.answer[j][k], abs=1e-4)
            assert full.format[j][k] < 0 and only.format[j][k] == 0.0
            assert only.potentials[j][k] == pytest.approx(only.answer[j][k], abs=1e-5)
    # answer_only by hand for the first state: context + the "<answer>" tokens, then the answer's tokens scored
    ids, start, end = answer_token_span(encode, render(answers[0][0]), answers[0][0])
    first = int(batch.policy_mask[batch.trajectories[0].rows[0]].nonzero()[0])
    ctx = batch.input_ids[batch.trajectories[0].rows[0], :first].tolist()
    (lp,) = score_continuations(model, [ctx + ids[:start]], [ids[start:end]])
    assert only.potentials[0][0] == pytest.approx(math.fsum(lp), abs=1e-5)
    assert only.potentials[0][0] != pytest.approx(full.potentials[0][0], abs=1e-3)
    with pytest.raises(ValueError, match="potential_scope"):
        tips_potential_terms(score, contexts, answers, encode, render, scope="tags")


@pytest.mark.parametrize("scope", ["full", "answer_only"])
def test_the_step_logs_the_split_and_the_scope_that_ran(scope):
    preset, overrides = METHODS["tips"]
    config = load_config(preset, [*SMALL, *overrides, f"algorithm.tips.potential_scope={scope}"])
    assert config.algorithm.tips.potential_scope == scope
    model, tokenizer = load_base_model("tiny", seed=0)
    trees, _ = _tips_batch()
    by_id = {e.id: e for e in EXAMPLES}
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        m = trainer.learn(trees, [by_id[t.prompt_id] for t in trees]).metrics
    finally:
        trainer.close()
    assert m["tips/answer_only"] == (1.0 if scope == "answer_only" else 0.0)
    if scope == "full":  # one alias per question: Phi(S_0) = its format part + its answer part
        assert m["tips/phi_0"] == pytest.approx(m["tips/phi_0_format"] + m["tips/phi_0_answer"], abs=1e-3)
        assert m["tips/phi_0_format"] < 0
    else:
        assert m["tips/phi_0_format"] == 0.0 and m["tips/phi_0"] == pytest.approx(
            m["tips/phi_0_answer"], abs=1e-4
        )


def test_default_scope_is_the_papers_and_documented():
    """Regression (issue 48): the default was the released code's ``full``; Eq. 15-16 and App. H score the answer
    alone, and the paper wins over the code."""
    for preset in ("tips-kb-multihop", "tips-arith-tools"):
        t = load_config(preset).algorithm.tips
        assert t.potential_scope == "answer_only"
    description = type(t).model_fields["potential_scope"].description
    assert "Eq. 15-16" in description and "'full' (the released code" in description
