"""Teacher scoring's requests and the log-probs assembled from the answers (agentcredit/integrations/verl/scoring.py).

The servers here are scripted: they answer protocol-correct payloads the way vLLM 0.24 (behind verl 0.9.1's
``generate``: ``prompt_logprobs`` rows, ``num_cached_tokens``) and SGLang 0.5.12's ``/generate``
(``meta_info.input_token_logprobs`` from ``logprob_start_len`` on) answer them, with a prefix cache modelled on
each engine's rule (vLLM: whole 16-token blocks of the longest prefix seen, at most all but the last token, and
rows of cached positions left unwritten, here NaN; SGLang: the match capped at ``logprob_start_len``). What is
under test is our request and assembly code, not the engines: that each backend receives the fields, start offset
and cache switch it needs, and that the log-probs assembled from its answers equal the old whole-sequence path's.
"""

from __future__ import annotations

import asyncio
import math
import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("verl")

from agentcredit.integrations.verl.scoring import (  # noqa: E402
    TeacherScorer,
    full_params,
    prompt_rows,
    rows_computed,
    sglang_logprobs,
    sglang_request,
    vllm_cached_params,
)

pytestmark = pytest.mark.verl

BLOCK = 16


def true_logprob(ids, p):
    """The scripted model: log p(ids[p] | ids[:p]), a function of the whole prefix (misalignment shows)."""
    return -((sum(ids[: p + 1]) * 31 + 7 * p + ids[p]) % 997) / 100.0 - 0.01


def common_prefix(a, b):
    return len(os.path.commonprefix([list(a), list(b)]))


class ScriptedVllm:
    """verl's LLMServerClient in front of vLLM 0.24: ``generate`` answers ``prompt_logprobs`` rows and
    ``num_cached_tokens``; rows at cached positions are unwritten (NaN), as vLLM's empty_cpu buffer leaves them."""

    def __init__(self, report_cached=True, runner="v1"):
        self.runner = (
            runner  # vLLM 0.24's model runner: v1 (Qwen2) or v2 (the default for Llama, Qwen3, Mistral)
        )
        self.seen: list[list[int]] = []
        self.calls: list[dict] = []
        self.forwarded = 0  # tokens run through the model (prefill)
        self.rows_computed = 0  # prompt-logprob rows (full-vocabulary log-softmax) the engine computed
        self.report_cached = report_cached

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        ids = list(prompt_ids)
        self.calls.append({"request_id": request_id, "ids": ids, "params": dict(sampling_params)})
        skip = sampling_params.get("skip_reading_prefix_cache")
        if skip is None:  # vLLM's SamplingParams.__post_init__ default
            skip = sampling_params.get("prompt_logprobs") is not None
        hit = 0 if skip else max((common_prefix(ids, s) for s in self.seen), default=0)
        cached = min(hit, len(ids) - 1) // BLOCK * BLOCK
        rows = [[true_logprob(ids, r + 1)] if r >= cached else [math.nan] for r in range(len(ids) - 1)]
        names = [[ids[r + 1]] if r >= cached else [-1] for r in range(len(ids) - 1)]  # the token of each row
        if self.runner == "v2":  # only the rows it computed (v1/worker/gpu/: compute_prompt_logprobs)
            rows, names = rows[cached:], names[cached:]
        self.forwarded += len(ids) - cached
        self.rows_computed += len(ids) - 1 - cached
        self.seen.append(ids)
        # verl's extract_prompt_logprobs: one row per prompt token after the first, then a padding row
        extra = {"prompt_logprobs": rows + [[0.0]], "prompt_ids": names + [[0]]}
        if self.report_cached:
            extra["num_cached_tokens"] = cached
        return SimpleNamespace(token_ids=[0], extra_fields=extra)


class ScriptedSglang:
    """verl's load balancer (``_acquire_server`` / ``_release_server``) and SGLang's ``/generate`` endpoint."""

    def __init__(self):
        self.seen: list[list[int]] = []
        self.posts: list[tuple[str, dict]] = []
        self.held: list[str] = []
        self.forwarded = 0
        self.rows_computed = 0

    async def _acquire_server(self, request_id, **extra):
        self.held.append(request_id)
        return "10.1.2.3:31000", object()

    def _release_server(self, server_id, request_id=None):
        assert server_id == "10.1.2.3:31000"
        self.held.remove(request_id)

    async def generate(self, *args, **kwargs):
        raise AssertionError("the SGLang route does not go through verl's generate")

    async def post(self, url, payload):
        self.posts.append((url, payload))
        ids, start = payload["input_ids"], payload["logprob_start_len"]
        # SGLang's Req._compute_max_prefix_len: the match is at most len - 1 and at most logprob_start_len
        hit = min(max((common_prefix(ids, s) for s in self.seen), default=0), len(ids) - 1, start)
        self.forwarded += len(ids) - hit
        self.rows_computed += len(ids) - start  # logits from logprob_start_len on (the last one samples)
        self.seen.append(list(ids))
        # _process_input_token_logprobs: [None] + log-probs of tokens start+1.., ids origin_input_ids[start:]
        entries = [[None, ids[start], None]] + [
            [true_logprob(ids, p), ids[p], None] for p in range(start + 1, len(ids))
        ]
        return {"text": "", "meta_info": {"input_token_logprobs": entries, "cached_tokens": hit}}


def _ids():
    counter = iter(range(10**6))
    return lambda: f"ep-{next(counter)}"


def old_path(context, continuation):
    """The whole-sequence path's numbers: every prompt row computed, the continuation's sliced out."""
    ids = context + continuation
    return [true_logprob(ids, p) for p in range(len(context), len(ids))]


def scorer(engine, server, **kw):
    post = getattr(server, "post", None)
    return TeacherScorer(server, engine, _ids(), post=post, **kw)


def test_vllm_request_reads_the_prefix_cache_with_detokenize_off():
    assert vllm_cached_params() == {
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
        "detokenize": False,
        "skip_reading_prefix_cache": False,
    }
    assert full_params("sglang") == {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}


def test_rows_computed_is_vllms_row_rule():
    # row j = log p(ids[j+1] | ids[:j+1]) is computed iff j >= num_cached_tokens; the continuation starts at row ctx-1
    assert rows_computed(0, 1) and rows_computed(31, 32)
    assert not rows_computed(32, 32)  # the context's last block cached whole: row 31 was not computed
    assert not rows_computed(None, 32) and not rows_computed(True, 32)


def test_sglang_request_starts_at_the_row_that_predicts_the_continuation():
    payload = sglang_request([5, 6, 7, 8, 9], 3, "rid-1")
    assert payload == {
        "rid": "rid-1",
        "input_ids": [5, 6, 7, 8, 9],
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": 2,
        "return_text_in_logprobs": False,
        "stream": False,
    }
    answer = {"meta_info": {"input_token_logprobs": [[None, 7, None], [-0.5, 8, None], [-1.5, 9, None]]}}
    assert sglang_logprobs(answer, [5, 6, 7, 8, 9], 3) == [-0.5, -1.5]
    with pytest.raises(ValueError, match="other token ids"):
        sglang_logprobs(
            {"meta_info": {"input_token_logprobs": [[None, 7, None], [-0.5, 1, None], [-1.5, 9, None]]}},
            [5, 6, 7, 8, 9],
            3,
        )
    with pytest.raises(ValueError, match="expected 3"):
        sglang_logprobs(
            {"meta_info": {"input_token_logprobs": [[-0.5, 8, None], [-1.5, 9, None]]}}, [5, 6, 7, 8, 9], 3
        )
    with pytest.raises(ValueError, match="context of at least one token"):
        sglang_request([5, 6], 2, "r")


def test_sglang_scoring_goes_to_the_routed_replicas_endpoint_and_releases_it():
    server = ScriptedSglang()
    context, continuation = list(range(1, 40)), [50, 51, 52]
    out = asyncio.run(scorer("sglang", server)(context, continuation))
    assert out == old_path(context, continuation)
    ((url, payload),) = server.posts
    assert url == "http://10.1.2.3:31000/generate" and payload["logprob_start_len"] == len(context) - 1
    assert payload["input_ids"] == context + continuation and server.held == []


def test_a_vllm_cache_hit_that_reaches_the_continuation_is_scored_again_afresh():
    server = ScriptedVllm()
    s = scorer("vllm", server)
    context = list(range(1, 33))  # two whole blocks
    server.seen.append(context + [99, 98])  # the rollout saw the context: both its blocks are cached
    out = asyncio.run(s(context, [7, 8]))
    assert out == old_path(context, [7, 8])  # no NaN of an unwritten row reached the result
    first, second = server.calls
    assert (
        first["params"]["skip_reading_prefix_cache"] is False
        and "skip_reading_prefix_cache" not in second["params"]
    )
    assert s.stats == {"requests": 2, "resent": 1}


def test_vllms_v2_runner_returns_only_the_computed_rows():
    """issue 51: vLLM 0.24's V2 model runner (Llama, Qwen3, Mistral) answers the rows it computed, not all P - 1
    rows with the cached ones unwritten; the cached path raised "returned no prompt_logprobs" on every call."""
    server = ScriptedVllm(runner="v2")
    s = scorer("vllm", server)
    context = list(range(1, 40))  # 2 whole blocks cached, 7 context tokens computed
    server.seen.append(context + [99])
    assert asyncio.run(s(context, [7, 8, 9])) == old_path(context, [7, 8, 9])
    assert s.stats == {"requests": 1, "resent": 0}  # read from the cache, not sent again
    (call,) = server.calls
    assert len(server.calls) == 1 and call["params"] == vllm_cached_params()
    # rows naming other tokens than the ones sent: another layout, refused rather than scored at wrong positions
    with pytest.raises(ValueError, match="is for token"):
        prompt_rows({"prompt_logprobs": [[-1.0], [-2.0], [0.0]], "prompt_ids": [[6], [9], [0]]}, [5, 6, 7, 8])


def test_an_unreported_vllm_cache_hit_is_no_proof():
    server = ScriptedVllm(report_cached=False)
    s = scorer("vllm", server)
    assert asyncio.run(s([1, 2, 3], [4, 5])) == old_path([1, 2, 3], [4, 5])
    assert s.stats == {"requests": 2, "resent": 1}


def test_old_path_is_kept_for_other_engines_and_on_request():
    for engine, kw in (("trtllm", {}), ("vllm", {"cached": False})):
        server = ScriptedVllm()
        s = scorer(engine, server, **kw)
        assert asyncio.run(s([1, 2, 3], [4])) == old_path([1, 2, 3], [4])
        ((call,),) = [server.calls]
        assert call["params"] == full_params(engine)


@settings(max_examples=60, deadline=None)
@given(
    engine=st.sampled_from(["vllm", "vllm-v2", "sglang"]),
    prefix=st.lists(st.integers(1, 50), min_size=1, max_size=70),
    episodes=st.lists(
        st.tuples(
            st.lists(st.integers(1, 50), max_size=30), st.lists(st.integers(1, 50), min_size=1, max_size=12)
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_cached_scoring_equals_the_whole_sequence_path(engine, prefix, episodes):
    """Property: contexts that share a prefix (a rollout's boundaries, a question's teacher prompt), scored one
    after another on a server whose cache holds what it saw, give the old path's log-probs exactly (vLLM: either
    model runner's row layout)."""
    server = {"vllm": ScriptedVllm(), "vllm-v2": ScriptedVllm(runner="v2"), "sglang": ScriptedSglang()}[
        engine
    ]
    engine = engine.removesuffix("-v2")
    s = scorer(engine, server)
    for middle, continuation in episodes:
        context = prefix + middle
        server.seen.append(context + [0])  # the rollout's own request for this context
        assert asyncio.run(s(context, continuation)) == old_path(context, continuation)


def test_a_shared_prefix_is_computed_once():
    """GEAR's case: one teacher prompt, several responses. The old path computes every prompt row of every call;
    the cached paths run the prompt once (the scripted servers' token and row counts, not a GPU measurement)."""
    teacher_prompt = list(range(1, 201))
    responses = [[7, 8, 9, 10] * 5, [11, 12] * 10, [13] * 20]
    counts = {}
    for engine, cached in (("vllm", False), ("vllm", True), ("sglang", True)):
        server = ScriptedVllm() if engine == "vllm" else ScriptedSglang()
        s = scorer(engine, server, cached=cached)
        for response in responses:
            assert asyncio.run(s(teacher_prompt, response)) == old_path(teacher_prompt, response)
        counts[(engine, cached)] = (server.forwarded, server.rows_computed)
    assert counts[("vllm", False)] == (3 * 220, 3 * 219)  # skip_reading_prefix_cache: every call from scratch
    # vLLM: the first call computes everything, the next two read 192 cached tokens (12 whole blocks) each
    assert counts[("vllm", True)] == (220 + 2 * 28, 219 + 2 * 27)
    # SGLang: the match stops at logprob_start_len = 199; log-probs from there on only, in every call
    assert counts[("sglang", True)] == (220 + 2 * 21, 3 * 21)
