"""GEAR's teacher on verl sees what it sees on the native trainer: the same prompt, tau* included, and the same
log-probs for the same episode (issue 36, after issue 31's tau* on the native trainer).

One kb-multihop episode (a student that searches the first hop and answers wrong) runs through verl's agent loop
as verl's worker builds it, with the native environment's own search tool as the worker's tools and a server that
scores with the tiny model (a teacher-forced forward, as vLLM's prompt log-probs are); the native trainer's
``gear_teacher_logprobs`` scores the same tokens with the same model and its own ReferenceTrajectories.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from agentcredit.config import load_config  # noqa: E402
from agentcredit.credit.methods.gear.teacher import (  # noqa: E402
    gear_ground_truth,
    gear_teacher_logprobs,
    gear_teacher_prompt,
)
from agentcredit.environment import build_environment  # noqa: E402
from agentcredit.integrations.verl.fields import RowRecord  # noqa: E402
from agentcredit.models.loading import load_base_model  # noqa: E402
from agentcredit.rollout.tree import RolloutTree, Segment  # noqa: E402
from agentcredit.tasks import load_task  # noqa: E402
from agentcredit.train import signals  # noqa: E402
from agentcredit.train.batch import build_batch  # noqa: E402
from agentcredit.train.sft import ReferenceTrajectories  # noqa: E402

from .test_verl_agent_loop import FakeServer, _run_loop  # noqa: E402

pytestmark = pytest.mark.verl

PRESET = "gear-kb-multihop"
#: the native preset's protocol (tags, Search-R1's style, max_segments 6) on verl's block
PROTOCOL = ["+agentcredit.protocol_options.max_segments=6"]


class ModelServer(FakeServer):
    """Scripted turns; scoring requests answered with the model's teacher-forced log-probs (vLLM's rows), nothing
    of the sequence cached."""

    def __init__(self, tokenizer, texts, model):
        super().__init__(tokenizer, texts)
        self.model = model

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if "prompt_logprobs" not in sampling_params:
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        self.scored.append(list(prompt_ids))
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            logp = torch.log_softmax(self.model(ids).logits[0].float(), dim=-1)
        rows = logp[:-1].gather(1, ids[0, 1:, None])[:, 0].tolist()
        extra = {"prompt_logprobs": [[x] for x in rows] + [[0.0]], "num_cached_tokens": 0}
        return TokenOutput(token_ids=[0], extra_fields=extra)


@pytest.fixture(scope="module")
def env():
    environment = build_environment(load_config(PRESET))
    yield environment
    environment.close()


def test_verl_and_native_give_gears_teacher_the_same_prompt_and_log_probs(env):
    model, tokenizer = load_base_model("tiny", seed=0)
    model.eval()
    example = next(
        e for e in load_task("kb-multihop", split="train", limit=12, seed=0) if e.info["hops"] == 2
    )
    (s1, _, _), _ = example.info["chain"]
    turns = [
        f"<think>I need information about {s1}.</think>\n<search>{s1}</search>",
        "<answer>Nowhere</answer>",
    ]
    server = ModelServer(tokenizer, turns, model)
    out = _run_loop(
        tokenizer,
        "gear",
        server,
        PROTOCOL,
        runtime=env.tools,
        question=example.question,
        answers=example.answers,
        example_info=json.dumps(example.info),  # as prepare-data writes it
    )
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    (scored,) = server.scored
    response = list(out.response_ids)
    verl_teacher_prompt = scored[: -len(response)]

    # the native trainer: its tau*, its teacher prompt on its own prompt text, its teacher-forced pass
    reference = ReferenceTrajectories(env, tokenizer, "tags")(example)
    student_text = env.protocol.prompt(env.protocol.new_episode(example.question), tokenizer)
    student_ids = tokenizer(student_text, add_special_tokens=False)["input_ids"]
    assert list(out.prompt_ids) == student_ids  # the student's prompt is the same on both trainers
    template = load_config(PRESET).algorithm.gear.template
    truth = gear_ground_truth(env.protocol, example, reference)
    native_text = gear_teacher_prompt(
        env.protocol, tokenizer, example.question, truth, template, student_prompt=student_text
    )
    assert verl_teacher_prompt == tokenizer(native_text, add_special_tokens=False)["input_ids"]
    assert f"<search>{example.info['chain'][1][0]}</search>" in tokenizer.decode(verl_teacher_prompt)

    tree = RolloutTree(Segment(student_ids, text=student_text, role="prompt"))
    leaf = tree.add(Segment(response, role="policy"), 0)
    tree.set_reward(leaf, 0.0)
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id or 0)
    native = gear_teacher_logprobs(
        partial(signals.logprobs_under_prompts, model),
        tokenizer,
        env.protocol,
        batch,
        [tree],
        {0: example},
        template,
        references={0: reference},
    )[0, len(student_ids) : len(student_ids) + len(response)]
    trained = torch.tensor(out.response_mask, dtype=torch.bool)
    got = torch.tensor(rec.teacher_logprobs)
    assert trained.any() and got.shape == native.shape
    torch.testing.assert_close(got[trained], native[trained].float(), atol=1e-5, rtol=1e-5)
