"""GEAR's teacher prompt is the student's prompt, built by the same protocol, with the ground truth inserted
(issue 11, item 3.2; spec gear.md §2.2, A1/A2).

The trainer used to render the teacher prompt with the tokenizer's chat template whatever the protocol, while
the student's prompt comes from ``protocol.prompt``. For a raw-text protocol (tags ``asearcher``: no chat
template, the prompt ends with an ``Assistant: <think>`` cue) the two differed, so the student's tokens were
scored after a chat header they were never sampled after. Checked for every protocol style: the teacher's
prompt is the student's prompt plus one inserted span holding the ground truth, it ends with the same tokens,
and the tokens the teacher scores are exactly the student's tokens.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from agentcredit.config import load_config
from agentcredit.credit.methods.gear.teacher import gear_teacher_logprobs, gear_teacher_prompt
from agentcredit.models.embedded import load_tokenizer
from agentcredit.models.scoring import TokenScores
from agentcredit.protocols import get_protocol
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tasks import Example
from agentcredit.train import signals
from agentcredit.train.batch import build_batch

STYLES = {
    "codefence": ("codefence", {}),
    "tags-search-r1": ("tags", {"style": "search-r1"}),
    "tags-asearcher": ("tags", {"style": "asearcher"}),
    "tags-qwen-tools": ("tags", {"style": "qwen-tools"}),
    "jsoncall": ("jsoncall", {}),
}
QUESTION = "Who wrote the play Hamlet?"
GOLD = "William Shakespeare"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def student_tree(protocol, tokenizer):
    """A one-segment episode laid out exactly as the rollout engine lays it out (prompt ids, then policy ids)."""
    state = protocol.new_episode(QUESTION)
    prompt = protocol.prompt(state, tokenizer)
    tree = RolloutTree(Segment(encode(tokenizer, prompt), prompt, role="prompt", kind="prompt"))
    answer = "I recall the author. " + protocol.render_answer(GOLD)
    leaf = tree.add(Segment(encode(tokenizer, answer), answer, role="policy", kind="answer"), 0)
    tree.set_reward(leaf, 1.0)
    return tree


@pytest.mark.parametrize("style", list(STYLES))
def test_teacher_prompt_is_the_students_with_the_answer_inserted(style, tokenizer, monkeypatch):
    name, options = STYLES[style]
    protocol = get_protocol(name, **options)
    tree = student_tree(protocol, tokenizer)
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    example = Example("q1", QUESTION, [GOLD], "hotpotqa", {})
    config = load_config("gear-arith-tools")

    captured = {}

    def fake_teacher_logprobs(model, batch, prompt_lengths, teacher_prompts, **kwargs):
        captured["prompt_lengths"], captured["teacher_prompts"] = list(prompt_lengths), list(teacher_prompts)
        return torch.zeros(batch.input_ids.shape)

    real_teacher_logprobs = signals.teacher_logprobs
    monkeypatch.setattr(signals, "teacher_logprobs", fake_teacher_logprobs)
    gear_teacher_logprobs(
        partial(signals.logprobs_under_prompts, None),
        tokenizer,
        protocol,
        batch,
        [tree],
        {0: example},
        config.algorithm.gear.template,
    )
    teacher_ids = captured["teacher_prompts"][0]
    student_ids = tree.segment(0).token_ids
    assert captured["prompt_lengths"] == [len(student_ids)]

    # 1. text: the teacher prompt is the student's prompt with one inserted span, after the question, that holds
    #    the ground truth; everything after the insertion (the assistant header / cue) is the student's
    student = tree.segment(0).text
    teacher = tokenizer.decode(teacher_ids)
    assert tokenizer.decode(student_ids) == student  # the decode round-trips on these prompts
    i = 0
    while i < min(len(student), len(teacher)) and student[i] == teacher[i]:
        i += 1
    assert i >= student.rfind(QUESTION) + len(QUESTION), "the reference must come after the question"
    assert teacher.endswith(student[i:]) and len(teacher) > len(student)
    inserted = teacher[i : len(teacher) - (len(student) - i)]
    assert protocol.render_answer(GOLD) in inserted and "reference solution" in inserted

    # 2. tokens: the context right before the student's first token is token-identical (same assistant cue)
    assert teacher_ids[-3:] == student_ids[-3:]

    # 3. the tokens the teacher scores are exactly the student's policy tokens, after the teacher's prompt
    seen = {}

    def fake_score_tokens(model, ids, attn, want, **kwargs):
        seen["ids"], seen["want"] = ids.clone(), want.clone()
        zeros = torch.zeros(ids.shape)
        return TokenScores(zeros, None, None)

    monkeypatch.setattr(signals, "score_tokens", fake_score_tokens)
    real_teacher_logprobs(
        None, batch, captured["prompt_lengths"], captured["teacher_prompts"], pad_id=tokenizer.pad_token_id
    )
    ids, want = seen["ids"][0], seen["want"][0]
    assert ids[want].tolist() == tree.segment(1).token_ids
    assert ids[: len(teacher_ids)].tolist() == teacher_ids
    assert want.nonzero()[0].item() == len(teacher_ids)


@pytest.mark.parametrize("style", list(STYLES))
def test_builder_matches_the_protocols_own_prompt(style, tokenizer):
    """Without the rollout's text, the builder renders the student's prompt through the protocol itself."""
    name, options = STYLES[style]
    protocol = get_protocol(name, **options)
    template = load_config("gear-arith-tools").algorithm.gear.template
    truth = protocol.render_answer(GOLD)
    rendered = protocol.prompt(protocol.new_episode(QUESTION), tokenizer)
    a = gear_teacher_prompt(protocol, tokenizer, QUESTION, truth, template)
    b = gear_teacher_prompt(protocol, tokenizer, QUESTION, truth, template, student_prompt=rendered)
    assert a == b and truth in a


def test_builder_rejects_a_prompt_without_the_user_message(tokenizer):
    protocol = get_protocol("codefence")
    with pytest.raises(ValueError, match="verbatim"):
        gear_teacher_prompt(
            protocol, tokenizer, QUESTION, GOLD, "{user} {ground_truth}", student_prompt="something else"
        )
