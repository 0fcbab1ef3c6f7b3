"""The engine-independent half of the agent loop: episodes against a scripted token server, rows, records.

The server is scripted (it returns fixed texts as token ids with fixed log-probs) so that the expected spans,
masks and contexts can be written down by hand; the protocols, tools runtime, rollout tree and verl's
``AgentLoopOutput`` are the real ones.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from agentcredit.credit import tips_potential  # noqa: E402
from agentcredit.integrations.verl.episode import (  # noqa: E402
    Generation,
    TreeRunner,
    answer_potentials,
    continuation_logprobs,
    episode_rows,
    teacher_logprobs,
)
from agentcredit.integrations.verl.fields import RowRecord  # noqa: E402
from agentcredit.protocols import get_protocol  # noqa: E402
from agentcredit.tools.base import ToolRuntime  # noqa: E402

pytestmark = pytest.mark.verl

LOGPROB = -0.5


class ScriptedServer:
    """Returns the scripted texts in order; honours ``stop`` like vLLM unless ``honour_stop`` is False."""

    def __init__(self, tokenizer, texts, *, honour_stop=True, eos_after=()):
        self.tok, self.texts, self.honour_stop = tokenizer, list(texts), honour_stop
        self.eos_after = set(eos_after)
        self.contexts, self.params, self.branches = [], [], []
        self.calls = 0  # generate requests
        self.script_index = 0  # scripted texts fully consumed

    async def generate(self, context, params, branch=None):
        """Like a deterministic model: a stop string truncates the text, and the next call continues it."""
        self.branches.append(branch)
        self.contexts.append(list(context))
        self.params.append(dict(params))
        self.calls += 1
        text = self.texts[0]
        if self.honour_stop and params.get("stop"):
            hits = [text.find(s) + len(s) for s in params["stop"] if s in text]
            if hits and min(hits) < len(text):
                self.texts[0] = text[min(hits) :]
                text = text[: min(hits)]
                return self._out(text, params, eos=False)
        self.texts.pop(0)
        self.script_index += 1
        return self._out(text, params, eos=self.script_index - 1 in self.eos_after)

    def _out(self, text, params, *, eos):
        ids = self.tok.encode(text, add_special_tokens=False)[: params["max_new_tokens"]]
        if eos and len(ids) < params["max_new_tokens"]:
            ids.append(self.tok.eos_token_id)
        return Generation(ids, [LOGPROB] * len(ids))


def _runtime(tools):
    return ToolRuntime(tools, max_workers=2)


def _run(protocol, question, tokenizer, server, tools, max_response=4096):
    prompt_ids = tokenizer.apply_chat_template(
        protocol.messages(protocol.new_episode(question)), add_generation_prompt=True, tokenize=True
    )["input_ids"]
    runtime = _runtime(tools)

    async def run_tools(calls):
        return runtime.run(calls)

    episode = asyncio.run(
        TreeRunner(
            protocol,
            protocol.new_episode(question),
            prompt_ids,
            tokenizer=tokenizer,
            generate=server.generate,
            run_tools=run_tools,
            sampling_params={"temperature": 1.0},
            max_segment_tokens=512,
            max_response_tokens=max_response,
            eos_token_ids=[tokenizer.eos_token_id],
        ).run_episode()
    )
    return prompt_ids, episode


def test_tags_episode_one_row_with_search_turn(byte_tokenizer):
    tok = byte_tokenizer
    proto = get_protocol("tags", style="search-r1")
    seg0 = "<think>need the author</think><search>author of X</search>"
    seg1 = "<think>found it</think><answer>Jane Doe</answer>"
    server = ScriptedServer(
        tok, [seg0 + " trailing text the server should not have written", seg1], honour_stop=False
    )
    server.eos_after = {1}
    prompt_ids, ep = _run(
        proto, "who wrote X", tok, server, {"search": lambda a: f"Doc 1 Jane Doe wrote {a['query']}"}
    )

    assert ep.answer == "Jane Doe" and ep.finished
    (row,) = episode_rows(ep, 1.0, episode_id="e1")
    rec = row.record
    kinds = [(s.role, s.kind, s.trained, s.segment) for s in rec.spans]
    assert kinds == [
        ("policy", "search", True, 0),
        ("observation", "information", False, None),
        ("policy", "answer", True, 1),
    ]
    # the search segment was cut right after </search>, even though the server ran past it
    n0 = len(tok.encode(seg0, add_special_tokens=False))
    assert rec.spans[0].start == 0 and rec.spans[0].end == n0
    obs_text = tok.decode(row.response_ids[rec.spans[1].start : rec.spans[1].end])
    assert obs_text == "\n\n<information>Doc 1 Jane Doe wrote author of X</information>\n\n"
    # the answer segment ends at </answer> (the tags protocol's stop), so the scripted EOS after it is dropped
    assert tok.decode(row.response_ids[rec.spans[2].start :]) == seg1
    assert row.response_mask == [1] * n0 + [0] * (rec.spans[1].end - n0) + [1] * (
        rec.spans[2].end - rec.spans[2].start
    )
    assert row.response_logprobs == [LOGPROB if m else 0.0 for m in row.response_mask]
    assert rec.tool_turns == [0] and rec.segment_kinds == ["search", "answer"] and rec.n_views == 1
    # boundaries: S_0 = prompt, S_1 = prompt + search segment + observation (exact ids, no re-tokenisation)
    assert ep.boundaries[0] == prompt_ids
    assert ep.boundaries[1] == prompt_ids + row.response_ids[: rec.spans[1].end]
    # the second generation started from exactly that context
    assert server.contexts[1] == ep.boundaries[1]
    # the record survives the JSON-able round trip verl's extra_fields go through
    assert RowRecord.model_validate(rec.model_dump()) == rec


def test_unconfirmed_stop_string_continues_the_segment(byte_tokenizer):
    """A ``` that closes no python block is a stop-string hit the protocol rejects: generation goes on."""
    tok = byte_tokenizer
    proto = get_protocol("codefence")
    part1 = "Some prose with ```"
    part2 = " inline fence and then\n```python\nprint(1)\n```"
    commit = "So \\boxed{1}"
    server = ScriptedServer(tok, [part1, part2, "<context>1</context>", commit], eos_after={3})
    _, ep = _run(proto, "what is 1", tok, server, {"python": lambda a: "1"})
    # call 1 stopped at the first ``` (not a python block: unconfirmed), so call 2 continued from context +
    # part1, and so on until the ``` that closes the python block
    assert server.contexts[1][-len(tok.encode(part1, add_special_tokens=False)) :] == tok.encode(
        part1, add_special_tokens=False
    )
    first = ep.tree.segment(ep.policy_nodes()[0])
    assert first.kind == "invoke" and first.text == part1 + part2
    assert server.calls == 5 and ep.answer == "1"


def test_codefence_replacement_gives_one_row_per_view(byte_tokenizer):
    tok = byte_tokenizer
    proto = get_protocol("codefence")  # replacement mode is the paper's default
    invoke = "I will search.\n```python\nprint(search('X'))\n```"
    assimilate = "<context>Jane Doe wrote X</context>"
    commit = "The answer is \\boxed{Jane Doe}"
    server = ScriptedServer(tok, [invoke, assimilate, commit], eos_after={2})
    prompt_ids, ep = _run(proto, "who wrote X", tok, server, {"python": lambda a: "Doc 1 Jane Doe wrote X"})
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    n_inv, n_asm = len(enc(invoke)), len(enc(assimilate))

    # the commit was generated from prompt + invoke + assimilate: the raw output was spliced out (Eq. 9)
    assert server.contexts[-1] == prompt_ids + enc(invoke) + enc(assimilate)
    # and the assimilate from the transient state prompt + invoke + raw output (Eq. 8)
    raw = server.contexts[-2][len(prompt_ids) + n_inv :]
    assert tok.decode(raw).startswith("\n```output\n") and "Jane Doe wrote X" in tok.decode(raw)

    rows = episode_rows(ep, 1.0, episode_id="e2")
    assert [r.record.view for r in rows] == [0, 1] and all(r.record.n_views == 2 for r in rows)
    v0, v1 = (r.record for r in rows)
    assert [(s.kind, s.trained, s.transient, s.segment) for s in v0.spans] == [
        ("invoke", True, False, 0),
        ("tool_output", False, True, None),
        ("assimilate", True, False, 1),
    ]
    # view 1 replays invoke + assimilate as context (not trained) and trains the commit
    assert [(s.kind, s.trained, s.segment) for s in v1.spans] == [
        ("invoke", False, 0),
        ("assimilate", False, 1),
        ("commit", True, 2),
    ]
    assert rows[1].response_ids[: n_inv + n_asm] == enc(invoke) + enc(assimilate)
    assert rows[1].response_mask == [0] * (n_inv + n_asm) + [1] * (len(rows[1].response_ids) - n_inv - n_asm)
    assert v0.segment_kinds == v1.segment_kinds == ["invoke", "assimilate", "commit"]
    assert v0.episode_id == v1.episode_id == "e2"


def test_response_budget_cuts_an_observation_that_does_not_fit(byte_tokenizer):
    tok = byte_tokenizer
    proto = get_protocol("tags", style="search-r1")
    seg0 = "<search>q</search>"
    server = ScriptedServer(tok, [seg0, "<answer>a</answer>"])
    n0 = len(tok.encode(seg0, add_special_tokens=False))
    _, ep = _run(proto, "q", tok, server, {"search": lambda a: "x" * 500}, max_response=n0 + 100)
    assert not ep.finished and ep.answer is None
    (row,) = episode_rows(ep, 0.0)
    assert len(row.response_ids) == n0 and row.record.tool_turns == []
    assert server.calls == 1


def test_continuation_logprobs_indexing():
    # lp[j] = log p(token j+1 | tokens 0..j): for a 3-token context the continuation starts at index 2
    lp = [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert continuation_logprobs(lp, 3, 2) == [-3.0, -4.0]
    with pytest.raises(ValueError, match="need 6 prompt log-probs"):
        continuation_logprobs(lp, 3, 4)
    with pytest.raises(ValueError, match="at least one token"):
        continuation_logprobs(lp, 0, 1)


def test_answer_potentials_sum_and_logsumexp(byte_tokenizer):
    """Phi(S) = logsumexp_a sum_j log p(z_j): hand-computed with a scorer that gives every token -0.1 * position."""
    tok = byte_tokenizer

    async def score(context, continuation):  # log p(token at position p) = -0.01 * p
        return [-0.01 * p for p in range(len(context), len(context) + len(continuation))]

    ctx0, ctx1 = [1, 2, 3], [1, 2, 3, 4, 5]
    phis = asyncio.run(
        answer_potentials(
            [ctx0, ctx1],
            ["ab", "ab ", "c"],
            tokenizer=tok,
            score=score,
            potential=tips_potential,
            answer_template="{answer}",
        )
    )
    import math

    # aliases de-duplicate to ["ab", "c"]; "ab" = 2 tokens at positions len(ctx).., "c" = 1 token
    def phi(n):
        ab = -0.01 * (n) - 0.01 * (n + 1)
        c = -0.01 * n
        return math.log(math.exp(ab) + math.exp(c))

    assert phis == pytest.approx([phi(3), phi(5)], abs=1e-12)


def test_answer_potentials_score_the_answer_alone_by_default(byte_tokenizer):
    """Issue 48: verl's potential reads Eq. 15-16 as the native trainer does: the answer tag is forced into the
    context and only the answer's own tokens are scored; ``full`` (the released code) scores the whole template."""
    tok = byte_tokenizer
    calls = []

    async def score(context, continuation):
        calls.append((list(context), list(continuation)))
        return [-1.0] * len(continuation)  # log p = -1 per scored token: Phi = -(tokens scored)

    ctx = [1, 2, 3]
    tag = tok.encode("<answer>", add_special_tokens=False)
    answer = tok.encode("ab", add_special_tokens=False)
    (only,) = asyncio.run(
        answer_potentials([ctx], ["ab"], tokenizer=tok, score=score, potential=tips_potential)
    )
    assert only == pytest.approx(-2.0)  # "ab": 2 byte tokens
    assert calls == [(ctx + tag, answer)]
    calls.clear()
    (full,) = asyncio.run(
        answer_potentials([ctx], ["ab"], tokenizer=tok, score=score, potential=tips_potential, scope="full")
    )
    assert full == pytest.approx(-len("<answer>ab</answer>"))
    assert calls == [(ctx, tok.encode("<answer>ab</answer>", add_special_tokens=False))]
    with pytest.raises(ValueError, match="potential_scope"):
        asyncio.run(
            answer_potentials(
                [ctx], ["ab"], tokenizer=tok, score=score, potential=tips_potential, scope="tags"
            )
        )


def test_teacher_logprobs_align_with_response_tokens():
    calls = []

    async def score(context, continuation):
        calls.append((context, continuation))
        return [float(-t) for t in continuation]  # log p(token) = -token id

    out = asyncio.run(teacher_logprobs([9, 9, 9, 9], [[1, 2, 3], []], score=score))
    assert out == [[-1.0, -2.0, -3.0], []]
    # the context is the teacher prompt; an empty response costs no call
    assert calls == [([9, 9, 9, 9], [1, 2, 3])]


def test_rows_become_verl_agent_loop_outputs(byte_tokenizer):
    """The rows pass verl's own AgentLoopOutput validation and as_dict() (what the TQ worker stores)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    tok = byte_tokenizer
    proto = get_protocol("tags", style="search-r1")
    server = ScriptedServer(tok, ["<search>q</search>", "<answer>a</answer>"], eos_after={1})
    prompt_ids, ep = _run(proto, "q", tok, server, {"search": lambda a: "doc"})
    (row,) = episode_rows(ep, 1.0)
    out = AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=row.response_ids,
        response_mask=row.response_mask,
        response_logprobs=row.response_logprobs,
        reward_score=1.0,
        num_turns=4,
        metrics=AgentLoopMetrics(),
        extra_fields={"agentcredit": row.record.model_dump()},
    )
    d = out.as_dict()
    assert d["responses"].tolist() == row.response_ids
    assert d["response_mask"].tolist() == row.response_mask
    assert d["rm_scores"][-1].item() == 1.0
    assert RowRecord.model_validate(d["extra_fields"]["agentcredit"]) == row.record
