"""GEAR's teacher is conditioned on a reference trajectory tau*, not on the final answer alone (issue 31, GEAR 1).

The paper builds the teacher state s_t* "from the same prompt under a reference trajectory tau* up to step t"
(GEAR §3.3, seed line 72) and names "tool-use benchmarks with annotated reference trajectories" as its setting
(App. D, seed line 389). agentcredit used to insert only ``render_answer(answers[0])``: the reverse KL then lands on
the answer tokens and a wrong search step looks as consistent with the teacher as a right one. The reference is
now the task's scripted demonstration (kb-multihop's ``info["chain"]``, a row's ``demo_calls``, the arith-tools
script) played through the episode's protocol and tools, so it reads like the student's own turns.
"""

from __future__ import annotations

import re
from functools import partial

import pytest
import torch
from train_helpers import EXAMPLES, SMALL, tiny_demonstrations

from agentcredit.config import load_config
from agentcredit.credit.methods.gear.teacher import gear_teacher_logprobs, reference_trajectories
from agentcredit.credit.signals import NoReference
from agentcredit.environment import build_environment
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.replay import replay
from agentcredit.tasks import Example, load_task
from agentcredit.train import signals
from agentcredit.train.batch import build_batch
from agentcredit.train.sft import ReferenceTrajectories
from agentcredit.train.trainer import Trainer


@pytest.fixture(scope="module")
def env():
    environment = build_environment(load_config("gear-kb-multihop"))
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def two_hop() -> Example:
    examples = load_task("kb-multihop", split="train", limit=12, seed=0)
    return next(e for e in examples if e.info["hops"] == 2)


def _wrong_search_episode(env, tokenizer, example):
    """A student that searches the first hop's entity, then a wrong one (another title from the first search's
    results, neither hop's subject), then answers wrong. Returns the tree and the wrong entity."""
    chain = example.info["chain"]
    wrong = []

    def student(turn, observation):
        if turn == 0:
            return f"<think>I need information about {chain[0][0]}.</think>\n<search>{chain[0][0]}</search>"
        if turn == 1:
            titles = re.findall(r"Title: ([^)]+)\)", observation)
            wrong.append(next(t for t in titles if t not in (chain[0][0], chain[1][0])))
            return f"<think>I need information about {wrong[0]}.</think>\n<search>{wrong[0]}</search>"
        return "<think>I have found the answer.</think>\n<answer>Nowhere</answer>"

    tree = replay(env.protocol, tokenizer, env.tools, example.question, student)
    tree.set_reward(tree.leaves()[0], 0.0)
    return tree, wrong[0]


def test_reference_is_the_demonstration_through_the_protocol(env, two_hop):
    from agentcredit.models.embedded import load_tokenizer

    tokenizer = load_tokenizer()
    references = ReferenceTrajectories(env, tokenizer, "tags")
    text = references(two_hop)
    (s1, _, bridge), (s2, _, answer) = two_hop.info["chain"]
    assert bridge == s2
    # the student's own format: one <search> per hop of the chain, the tool's <information>, then the answer
    assert re.findall(r"<search>(.*?)</search>", text) == [s1, s2]
    assert text.count("<information>") == 2
    assert text.endswith(env.protocol.render_answer(answer))
    assert two_hop.question not in text  # the prompt is not repeated
    assert references(two_hop) is text  # played once per example, then kept


def test_teacher_prompt_holds_the_reference_not_only_the_answer(env, two_hop, monkeypatch):
    from agentcredit.models.embedded import load_tokenizer

    tokenizer = load_tokenizer()
    tree, wrong = _wrong_search_episode(env, tokenizer, two_hop)
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    template = load_config("gear-kb-multihop").algorithm.gear.template
    captured = {}

    def fake_teacher_logprobs(model, batch, prompt_lengths, teacher_prompts, **kwargs):
        captured["prompt"] = tokenizer.decode(teacher_prompts[0])
        return torch.zeros(batch.input_ids.shape)

    monkeypatch.setattr(signals, "teacher_logprobs", fake_teacher_logprobs)
    reference = ReferenceTrajectories(env, tokenizer, "tags")(two_hop)
    gear_teacher_logprobs(
        partial(signals.logprobs_under_prompts, None),
        tokenizer,
        env.protocol,
        batch,
        [tree],
        {0: two_hop},
        template,
        references={0: reference},
    )
    prompt = captured["prompt"]
    assert reference in prompt and "<search>" + two_hop.info["chain"][1][0] + "</search>" in prompt
    assert f"<search>{wrong}</search>" not in reference  # the student's wrong call is no part of tau*


def test_the_preset_defaults_to_the_reference_trajectory():
    # paper §3.3 (seed line 72): s_t* is built under a reference trajectory tau*
    assert load_config("gear-kb-multihop").algorithm.gear.reference == "trajectory"


def test_a_protocol_without_a_demonstration_fails_with_one_line(env):
    from agentcredit.models.embedded import load_tokenizer

    tokenizer = load_tokenizer()
    with pytest.raises(NoReference, match="no-such-protocol"):  # the trainer's side names no method
        ReferenceTrajectories(env, tokenizer, "no-such-protocol")
    with pytest.raises(ValueError, match="algorithm.gear.reference=answer"):  # GEAR's home says what to do
        reference_trajectories(lambda: ReferenceTrajectories(env, tokenizer, "no-such-protocol"))


@pytest.mark.slow
def test_rkl_mass_moves_onto_the_wrong_search(env, two_hop):
    """On the embedded SmolLM2-135M: a student that searches the wrong entity at hop 2. Measured (2026-11-28, four
    2-hop training questions): the wrong search turn's share of the positive rKL mass was 0.005-0.12 under the
    answer-only teacher (0.74-0.94 sat on the first turn's tokens) and 0.21-0.91 under the reference teacher."""
    from agentcredit.models.embedded import load_model

    model, tokenizer = load_model()
    tree, _ = _wrong_search_episode(env, tokenizer, two_hop)
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    student, _, _ = signals.score_batch(model, batch)
    template = load_config("gear-kb-multihop").algorithm.gear.template
    reference = ReferenceTrajectories(env, tokenizer, "tags")(two_hop)
    shares = {}
    for name, refs in (("answer", None), ("reference", {0: reference})):
        teacher = gear_teacher_logprobs(
            partial(signals.logprobs_under_prompts, model),
            tokenizer,
            env.protocol,
            batch,
            [tree],
            {0: two_hop},
            template,
            references=refs,
        )
        positive = (student[0] - teacher[0]).clamp(min=0) * batch.policy_mask[0]
        _, start, end = signals.segment_spans(batch, batch.trajectories[0])[1]  # the second policy turn
        shares[name] = float(positive[start:end].sum() / positive.sum())
    assert shares["reference"] > 2 * shares["answer"], shares
    assert shares["reference"] > 0.15, shares


@pytest.mark.parametrize("reference", ["trajectory", "answer"])
def test_the_trainer_conditions_the_teacher_on_tau_star(reference, monkeypatch):
    """A GEAR step of the native trainer: with the default ``reference: trajectory`` the teacher prompt of the
    arith-tools question that needs the tool holds the scripted tool call (tau*); with ``answer`` it does not."""
    config = load_config("gear-arith-tools", [*SMALL, f"algorithm.gear.reference={reference}"])
    model, tokenizer = load_base_model("tiny", seed=0)
    trees = tiny_demonstrations(config, tokenizer)
    captured = []

    def fake_teacher_logprobs(model, batch, prompt_lengths, teacher_prompts, **kwargs):
        captured.extend(tokenizer.decode(ids) for ids in teacher_prompts)
        return torch.zeros(batch.input_ids.shape)

    monkeypatch.setattr(signals, "teacher_logprobs", fake_teacher_logprobs)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        batch = build_batch(trees, pad_id=tokenizer.pad_token_id)
        trainer.compute_signals(batch, trees, list(EXAMPLES))
    finally:
        trainer.close()
    hard = next(p for p in captured if "17*23" in p.split("reference solution")[0])
    shown = hard.split("Here is a reference solution:")[1]
    assert ("print(17*23)" in shown) == (reference == "trajectory")
    assert "\\boxed{391}" in shown  # the answer is there either way
