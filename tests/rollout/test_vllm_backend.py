"""``rollout.backend: vllm`` (issue 33) against the HF engine, on a tiny Llama: the same greedy tokens for the same
episodes, weights pushed after an update change the next rollout, and the trainer logs the rollout-vs-trainer
log-prob gap and the push time. Needs vLLM (``make test-vllm`` runs these in their own venv); skipped without it.

vLLM's CPU attention supports head sizes of 32 and up, so the tiny model here has head_dim 64 (SmolLM2's), not the
default tiny model's 16; it is overfit on the rollout demonstrations so that its episodes call tools for real.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from rollout_helpers import DEMOS, greedy_engine, one_thread, overfit, overfit_on_demos

from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import independent
from agentcredit.rollout.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (make test-vllm)"),
]

# a small KV reservation: the tiny model's episodes are a few hundred tokens
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

QUESTIONS = 2  # questions per demo
EPISODES = 2  # episodes per question


@pytest.fixture(scope="module")
def fitted(tiny):
    """A tiny Llama vLLM can run (head_dim 64), overfit on the rollout demonstrations, and the tokenizer."""
    from agentcredit.models.tiny import tiny_llama

    _, tokenizer = tiny
    model, _ = tiny_llama(
        seed=1,
        tokenizer=tokenizer,
        hidden_size=128,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=256,
        initializer_range=0.1,
    )
    overfit_on_demos(model, tokenizer)
    return model, tokenizer


@pytest.fixture(scope="module")
def backend(fitted):
    """One vLLM engine for the module (start-up is tens of seconds), holding the fitted model's weights."""
    from agentcredit.rollout.vllm_backend import VLLMBackend

    model, tokenizer = fitted
    with one_thread():
        b = VLLMBackend(model, tokenizer, threads=1, temperature=0.0)
    yield b
    b.close()


def greedy_trees(backend, tokenizer, demo, tools):
    engine = greedy_engine(backend, tokenizer, demo, tools)
    questions = [demo.question, demo.question + " Quick."][:QUESTIONS]
    return engine, engine.run(questions, independent(EPISODES), lambda item, answer: 0.0)


def shape(tree):
    return [
        (tree.nodes[n].parent, tree.segment(n).role, tree.segment(n).token_ids, tree.segment(n).transient)
        for n in range(len(tree))
    ]


@pytest.mark.parametrize("demo", DEMOS, ids=[d.name for d in DEMOS])
def test_vllm_and_hf_generate_the_same_greedy_tokens(fitted, backend, tools, demo):
    """Same episodes (tool calls, observations, carl-segment splices), token for token; behaviour log-probs agree to
    kernel rounding."""
    model, tokenizer = fitted
    hf_engine, expected = greedy_trees(HFBackend(model), tokenizer, demo, tools)
    engine, got = greedy_trees(backend, tokenizer, demo, tools)
    assert engine.stats.tool_calls == hf_engine.stats.tool_calls
    if demo.protocol == "codefence":  # the fit is good enough there for real tool calls and splices
        assert engine.stats.tool_calls >= 1
        assert demo.name != "codefence-replace" or engine.stats.splices >= 1
    assert [shape(t) for t in got] == [shape(t) for t in expected]
    worst = 0.0
    for tree_got, tree_want in zip(got, expected, strict=True):
        for n in range(len(tree_got)):
            if tree_got.segment(n).role == "policy":
                diff = torch.tensor(tree_got.segment(n).logprobs) - torch.tensor(
                    tree_want.segment(n).logprobs
                )
                worst = max(worst, float(diff.abs().max()))
    assert worst < 1e-3, worst


def test_pushed_weights_change_the_next_rollout(fitted, backend, tools):
    """An update (a few optimiser steps on another answer) pushed into the running engine: its next rollout is the
    updated model's (equal to the HF engine on it) and differs from the one before; pushing back restores it."""
    model, tokenizer = fitted
    demo = next(d for d in DEMOS if d.name == "codefence-replace")
    _, before = greedy_trees(backend, tokenizer, demo, tools)
    updated = copy.deepcopy(model)
    protocol = demo.build_protocol()
    prompt = tokenizer(
        protocol.prompt(protocol.new_episode(demo.question), tokenizer), add_special_tokens=False
    )["input_ids"]
    target = tokenizer("The answer is \\boxed{7}.<|im_end|>", add_special_tokens=False)["input_ids"]
    with one_thread():
        overfit(updated, [(prompt + target, [False] * len(prompt) + [True] * len(target))], steps=15)
    updated.eval()
    try:
        seconds = backend.push_weights(updated)
        assert 0 < seconds < 60
        _, after = greedy_trees(backend, tokenizer, demo, tools)
        _, hf_after = greedy_trees(HFBackend(updated), tokenizer, demo, tools)
        assert [shape(t) for t in after] != [shape(t) for t in before]
        assert [shape(t) for t in after] == [shape(t) for t in hf_after]
    finally:
        backend.push_weights(model)
    _, again = greedy_trees(backend, tokenizer, demo, tools)
    assert [shape(t) for t in again] == [shape(t) for t in before]


def test_sampled_rollouts_are_seeded_per_request(fitted, backend, tools):
    """At temperature 1 the same engine seed gives the same trees (each request has its own seed)."""
    model, tokenizer = fitted
    demo = next(d for d in DEMOS if d.name == "tags-search-r1")

    def run(seed):
        config = EngineConfig(max_segment_tokens=40, max_episode_tokens=120, seed=seed)
        engine = RolloutEngine(backend, tokenizer, demo.build_protocol(), tools, config)
        return [shape(t) for t in engine.run([demo.question] * 1, independent(4), lambda i, a: 0.0)]

    assert run(5) == run(5)


def test_many_seeded_requests_longer_than_one_scheduler_batch(backend):
    """Regression: 64 seeded requests whose prompts add up to more tokens than vLLM schedules at once. With chunked
    prefill (vLLM's default) a split prefill rewinds the request's generator and vLLM 0.32 on CPU crashed ("CPU
    Generator does not use offset"); the backend turns it off. Each request's tokens depend only on its seed."""
    from agentcredit.rollout.backend import SegmentRequest

    requests = [SegmentRequest(list(range(100 + i, 250 + i + i % 7)), 8, (), seed=i) for i in range(64)]
    assert sum(len(r.prompt) for r in requests) > 8192
    sampling = SamplingParams(temperature=0.7, top_p=0.95)
    first = backend.generate(requests, sampling, [2])
    again = backend.generate(list(reversed(requests)), sampling, [2])
    assert all(1 <= len(o.token_ids) <= 8 for o in first)  # a request may stop at id 2 (<|im_end|>)
    assert [o.token_ids for o in first] == [o.token_ids for o in reversed(again)]


def test_trainer_pushes_weights_and_logs_the_logprob_gap(fitted, backend):
    """``rollout.backend=vllm`` in the trainer: the engine starts once, the weights are pushed after every update
    (timed), and the gap between vLLM's recorded log-probs and the trainer's own forward is logged every step."""
    from agentcredit.config import load_config
    from agentcredit.tasks import Example
    from agentcredit.train.trainer import Trainer

    model, tokenizer = fitted
    examples = [
        Example("q1", "What is 17*23?", ["391"], "arith-tools", {"tier": "hard", "metric": "numeric"}),
        Example("q2", "What is 3+4?", ["7"], "arith-tools", {"tier": "easy", "metric": "numeric"}),
    ]
    config = load_config(
        "grpo-arith-tools",
        [
            "model.name=tiny",
            "rollout.backend=vllm",
            "rollout.prompts_per_step=2",
            "rollout.n=2",
            "rollout.max_new_tokens=40",
            "rollout.max_episode_tokens=96",
            "optim.minibatch_size=0",
            "optim.epochs=1",
            "optim.lr=1e-3",
            "train.tensorboard=false",
            "train.save_every=0",
        ],
    )
    trainer = Trainer(config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=examples, log=False)
    try:
        with one_thread():
            first = trainer.train_step().metrics
            engine = trainer.rollouts.vllm
            second = trainer.train_step().metrics
        assert trainer.rollouts.vllm is engine  # started once
        assert (
            first["rollout/backend_startup_seconds"] > 0 and "rollout/backend_startup_seconds" not in second
        )
        assert first["rollout/weight_push_seconds"] > 0 and second["rollout/weight_push_seconds"] > 0
        assert len(engine.push_seconds) == 2  # at start-up, then after the first update
        for metrics in (first, second):
            assert math.isfinite(metrics["rollout/logp_gap"]) and metrics["rollout/logp_gap"] < 1e-3
            assert metrics["rollout/logp_gap_max"] < 1e-2
    finally:
        trainer.close()
