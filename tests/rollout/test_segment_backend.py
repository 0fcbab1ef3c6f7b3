"""The engine's segment-generating path (``SegmentBackend``, what ``rollout.backend: vllm`` plugs into), tested
without vLLM: a reference backend that generates whole segments greedily with the HF model must give the same trees
as the HF engine, token for token, including tool calls, observations and carl-segment's splices; and a backend
that stops early (an unconfirmed stop string, a short answer) must be continued by the engine, not cut."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import DEMOS, greedy_engine

from agentcredit.rollout.backend import HFBackend, SegmentBackend, SegmentOutput, SegmentRequest
from agentcredit.rollout.sampling import recorded_logprobs
from agentcredit.rollout.strategies import entropy_guided, independent


class GreedyHFSegments(SegmentBackend):
    """Generates each segment greedily with a fresh HF forward per request (runs past protocol stops: only stop
    ids and the budget end it). ``chunk`` caps the tokens returned per request, as a server that stopped early
    at a stop string the protocol did not confirm."""

    def __init__(self, model, chunk: int | None = None):
        super().__init__()
        self.model, self.chunk = model, chunk
        self.requests: list[SegmentRequest] = []

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def generate(self, requests, sampling, stop_token_ids):
        assert sampling.greedy
        self.requests.extend(requests)
        outputs = []
        for req in requests:
            hf = HFBackend(self.model)
            seq = hf.new_sequence()
            logits = hf.extend({seq: req.prompt})[seq]
            ids, lps = [], []
            limit = min(req.max_tokens, self.chunk or req.max_tokens)
            while True:
                token = int(logits.argmax())
                ids.append(token)
                lps.append(float(recorded_logprobs(logits.unsqueeze(0), 0.0)[0, token]))
                if token in stop_token_ids or len(ids) >= limit:
                    break
                logits = hf.extend({seq: [token]})[seq]
            outputs.append(SegmentOutput(ids, lps))
        return outputs


def run(backend, model, tokenizer, demo, tools, strategy=None):
    engine = greedy_engine(backend, tokenizer, demo, tools)
    trees = engine.run(
        [demo.question, demo.question + " Quick."], strategy or independent(2), lambda i, a: 0.0
    )
    return engine, trees


def shape(tree):
    return [
        (tree.nodes[n].parent, tree.segment(n).role, tree.segment(n).token_ids, tree.segment(n).transient)
        for n in range(len(tree))
    ]


@pytest.mark.parametrize("demo", DEMOS, ids=[d.name for d in DEMOS])
@pytest.mark.parametrize("chunk", [None, 3])
def test_segment_backend_gives_the_hf_engines_greedy_trees(trained_tiny, tools, demo, chunk):
    model, tokenizer = trained_tiny
    hf_engine, expected = run(HFBackend(model), model, tokenizer, demo, tools)
    backend = GreedyHFSegments(model, chunk=chunk)
    engine, got = run(backend, model, tokenizer, demo, tools)
    assert engine.stats.tool_calls >= 1  # the overfit model calls tools: observations are in the contexts
    assert [shape(t) for t in got] == [shape(t) for t in expected]
    assert engine.stats.generated_tokens == hf_engine.stats.generated_tokens
    assert engine.stats.splices == hf_engine.stats.splices
    for tree_got, tree_want in zip(got, expected, strict=True):
        for n in range(len(tree_got)):
            seg, want = tree_got.segment(n), tree_want.segment(n)
            if seg.role == "policy":
                assert seg.entropies is None  # a segment backend gives no entropy
                assert seg.info["finish"] == want.info["finish"]
                assert torch.allclose(torch.tensor(seg.logprobs), torch.tensor(want.logprobs), atol=1e-4)
    # every request carried the sequence's full token prefix: the prompt first
    prompts = {tuple(t.segment(0).token_ids) for t in got}
    assert all(any(tuple(r.prompt[: len(p)]) == p for p in prompts) for r in backend.requests)
    if chunk is not None:  # the engine asked again for the rest of segments the backend stopped early
        assert len(backend.requests) > hf_engine.stats.segments


def test_segment_backend_under_a_tree_strategy(trained_tiny, tools):
    """Entropy-guided forking starts jobs from stored node states: with token sequences the forks are token
    copies, and the greedy trees equal the HF engine's."""
    model, tokenizer = trained_tiny
    demo = next(d for d in DEMOS if d.name == "codefence-replace")
    strategy = entropy_guided(1, 2)
    _, expected = run(HFBackend(model), model, tokenizer, demo, tools, strategy)
    _, got = run(GreedyHFSegments(model), model, tokenizer, demo, tools, strategy)
    assert [shape(t) for t in got] == [shape(t) for t in expected]


def test_segment_backend_sequences_are_token_lists():
    class Null(SegmentBackend):
        vocab_size = 10
        max_positions = 100

        def generate(self, requests, sampling, stop_token_ids):
            return []

    b = Null()
    s = b.new_sequence()
    assert b.extend({s: [1, 2, 3]}) == {}
    f = b.fork(s)
    b.truncate(s, 1)
    assert b.tokens(s) == [1] and b.tokens(f) == [1, 2, 3]
    block = b.export_block(f, 1, 3)
    g = b.sequence_from_blocks([[7], block])
    assert b.tokens(g) == [7, 2, 3] and b.length(g) == 3
    b.release(f)
    with pytest.raises(ValueError, match="does not exist"):
        b.length(f)
    with pytest.raises(ValueError, match="no tokens"):
        b.extend({s: []})
    with pytest.raises(ValueError, match="outside"):
        b.truncate(s, 5)
