"""Issue 33: the prefix every prompt of a call shares (system prompt, tool schemas) is prefilled once per call and
its cache copied into each question's sequence; each question then prefills only its own remainder."""

from __future__ import annotations

import torch
from rollout_helpers import CALC_SCHEMA

from agentcredit.protocols import get_protocol
from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import SHARED_PREFIX_MIN, EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import independent

QUESTIONS = ["Who wrote Hamlet?", "What is 17 * 23?", "Capital of Peru", "Name a prime above 100."]


def engine_for(model, tokenizer, protocol, **config) -> RolloutEngine:
    config.setdefault("max_segment_tokens", 12)
    config.setdefault("max_episode_tokens", 40)
    config.setdefault("max_turns", 3)
    return RolloutEngine(HFBackend(model), tokenizer, protocol, None, EngineConfig(**config))


def prompt_ids(tokenizer, protocol, question: str) -> list[int]:
    text = protocol.prompt(protocol.new_episode(question), tokenizer)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def common_prefix(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows) - 1
    for row in rows[1:]:
        n = next((k for k in range(n) if row[k] != rows[0][k]), n)
    return n


def test_cached_prefix_gives_the_logits_of_a_full_prefill(tiny):
    """Backend level: a sequence assembled from the shared prefix's exported block plus its own remainder returns
    the logits of a sequence that prefilled everything itself (fp32 rounding only), and the same argmax."""
    model, tokenizer = tiny
    protocol = get_protocol("jsoncall", schemas=[CALC_SCHEMA])
    prompts = [prompt_ids(tokenizer, protocol, q) for q in QUESTIONS]
    shared = common_prefix(prompts)
    assert shared >= SHARED_PREFIX_MIN  # jsoncall's system prompt and tool schemas come first

    full = HFBackend(model)
    seqs = [full.new_sequence() for _ in prompts]
    reference = full.extend(dict(zip(seqs, prompts, strict=True)))

    cached = HFBackend(model)
    first = cached.new_sequence()
    cached.extend({first: prompts[0][:shared]})
    block = cached.export_block(first, 0, shared)
    cached.release(first)
    rows = [cached.sequence_from_blocks([block]) for _ in prompts]
    got = cached.extend({row: p[shared:] for row, p in zip(rows, prompts, strict=True)})
    for seq, row in zip(seqs, rows, strict=True):
        assert torch.allclose(got[row], reference[seq], atol=2e-5), (got[row] - reference[seq]).abs().max()
        assert int(got[row].argmax()) == int(reference[seq].argmax())
    # and a decode step after it still agrees
    step_ref = full.extend({s: [42] for s in seqs})
    step_got = cached.extend({r: [42] for r in rows})
    for seq, row in zip(seqs, rows, strict=True):
        assert torch.allclose(step_got[row], step_ref[seq], atol=2e-5)


def _trees(model, tokenizer, protocol, sampling, share: bool):
    engine = engine_for(model, tokenizer, protocol, sampling=sampling, share_prompt_prefix=share)
    trees = engine.run(QUESTIONS, independent(2), lambda *_: 0.0, seed=3)
    return engine, trees


def test_engine_prefills_the_shared_prefix_once_and_samples_the_same_episodes(tiny):
    """Greedy and sampled: the same tokens with and without the shared prefix, log-probs within fp32 tolerance,
    and the prefix's tokens prefilled once instead of once per question.

    Sampling draws the same uniforms in the same order either way (one per token from each job's own generator);
    only the logits' fp32 rounding differs (prefix and remainder are two forwards instead of one). A draw flips
    only when that rounding moves the CDF across the uniform: likely on the random tiny model's near-flat
    distribution over the whole 49k vocabulary with top-p (measured: one episode in two differed), negligible
    with top-k = 100 as here, and on a trained policy's peaked distributions."""
    model, tokenizer = tiny
    protocol = get_protocol("jsoncall", schemas=[CALC_SCHEMA])
    prompts = [prompt_ids(tokenizer, protocol, q) for q in QUESTIONS]
    shared = common_prefix(prompts)
    for sampling in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=100)):
        on, with_prefix = _trees(model, tokenizer, protocol, sampling, share=True)
        off, without = _trees(model, tokenizer, protocol, sampling, share=False)
        for a, b in zip(with_prefix, without, strict=True):
            assert [n.segment.token_ids for n in a.nodes] == [n.segment.token_ids for n in b.nodes]
            for x, y in zip(a.nodes, b.nodes, strict=True):
                if x.segment.role == "policy":
                    assert torch.allclose(
                        torch.tensor(x.segment.logprobs), torch.tensor(y.segment.logprobs), atol=1e-5
                    )
        assert on.stats.shared_prefix_tokens == shared and off.stats.shared_prefix_tokens == 0
        assert off.stats.prefill_tokens - on.stats.prefill_tokens == (len(QUESTIONS) - 1) * shared
        assert on.stats.generated_tokens == off.stats.generated_tokens


def test_no_shared_prefix_for_one_prompt_short_prefixes_or_without_reuse(tiny):
    model, tokenizer = tiny
    jsoncall = get_protocol("jsoncall", schemas=[CALC_SCHEMA])
    one = engine_for(model, tokenizer, jsoncall)
    one.run(QUESTIONS[:1], independent(2), lambda *_: 0.0)
    assert one.stats.shared_prefix_tokens == 0  # a single question: its group already shares its prompt
    no_reuse = engine_for(model, tokenizer, jsoncall, reuse_prefix=False)
    no_reuse.run(QUESTIONS[:2], independent(1), lambda *_: 0.0)
    assert no_reuse.stats.shared_prefix_tokens == 0
    # the base chat template shares only its short header: not worth a forward of its own
    codefence = get_protocol("codefence")
    prompts = [prompt_ids(tokenizer, codefence, q) for q in QUESTIONS]
    engine = engine_for(model, tokenizer, codefence)
    engine.run(QUESTIONS, independent(1), lambda *_: 0.0)
    expected = common_prefix(prompts) if common_prefix(prompts) >= SHARED_PREFIX_MIN else 0
    assert engine.stats.shared_prefix_tokens == expected
