"""The agent loop as verl's worker builds and runs it (hydra.utils.instantiate of the registered entry).

Only the LLM server is replaced, by a scripted token server with verl's ``generate`` signature (it also answers
``prompt_logprobs`` requests, as vLLM does for verl's teacher); the config is a composed shipped config, the
tokenizer a real (byte-level) one, the protocols, tools, scorer and credit records the real ones.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

import hydra  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import agentcredit.integrations.verl.agent_loop as agent_loop_module  # noqa: E402
import agentcredit.integrations.verl.scoring as scoring_module  # noqa: E402
import agentcredit.integrations.verl.signals as signals_module  # noqa: E402
from agentcredit.integrations.verl import AGENT_LOOP_NAME, config_dir  # noqa: E402
from agentcredit.integrations.verl.data import protocol_tag  # noqa: E402
from agentcredit.integrations.verl.fields import RowRecord  # noqa: E402
from agentcredit.protocols import get_protocol  # noqa: E402
from agentcredit.tools.base import ToolRuntime  # noqa: E402

pytestmark = pytest.mark.verl


class FakeServer:
    """verl's LLMServerClient.generate signature; scripted completions; log p(token j) = -0.001 * j. Scoring requests
    are answered as vLLM with an empty prefix cache answers them (``num_cached_tokens`` 0, every row computed); the
    SGLang route's ``/generate`` is answered by :meth:`sglang_generate` (tests/integrations/test_verl_scoring.py
    scripts the caches themselves)."""

    def __init__(self, tokenizer, texts):
        self.tok, self.texts = tokenizer, list(texts)
        self.scored: list[list[int]] = []
        self.request_ids: list[str] = []  # of the policy turns; teacher scoring requests in score_ids
        self.score_ids: list[str] = []
        self.score_params: list[dict] = []  # the sampling params of the teacher scoring requests
        self.posts: list[tuple[str, dict]] = []  # SGLang's /generate calls: (url, payload)
        self.routes: list[str] = []  # the load balancer's key of every call (the replica it lands on)
        self.seeds: list[int | None] = []  # the sampling seed of each policy turn

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        """verl's LLMServerClient.generate: routed by the request id, which (under full determinism) vLLM gets."""
        self.routes.append(request_id)
        return await self._answer(request_id, prompt_ids, sampling_params)

    async def _answer(self, request_id, prompt_ids, sampling_params):
        if "prompt_logprobs" in sampling_params:
            self.score_ids.append(request_id)
            self.score_params.append(dict(sampling_params))
            self.scored.append(list(prompt_ids))
            lp = [[-0.001 * j] for j in range(1, len(prompt_ids))] + [[0.0]]
            return TokenOutput(token_ids=[0], extra_fields={"prompt_logprobs": lp, "num_cached_tokens": 0})
        text = self.texts.pop(0)
        stops = sampling_params.get("stop") or []
        hits = [text.find(s) + len(s) for s in stops if s in text]
        if hits and min(hits) < len(text):
            self.texts.insert(0, text[min(hits) :])
            text = text[: min(hits)]
            ids = self.tok.encode(text, add_special_tokens=False)
        else:  # the scripted text is used up: the model ends its turn
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        self.request_ids.append(request_id)
        self.seeds.append(sampling_params.get("seed"))
        return TokenOutput(
            token_ids=ids,
            log_probs=[-0.25] * len(ids),
            extra_fields={"min_global_steps": 7, "max_global_steps": 8},
        )

    async def _acquire_server(
        self, request_id, **extra
    ):  # verl's LLMServerClient: the replica for a routing id
        self.routes.append(request_id)
        return "10.0.0.7:30000", _ServerActor(self)

    def _release_server(self, server_id, request_id=None):
        pass

    def sglang_generate(self, url, payload):
        self.posts.append((url, payload))
        self.score_ids.append(payload["rid"])
        ids, start = payload["input_ids"], payload["logprob_start_len"]
        self.scored.append(list(ids))
        entries = [[None if p == start else -0.001 * p, ids[p], None] for p in range(start, len(ids))]
        return {"meta_info": {"input_token_logprobs": entries}}


class _ServerActor:
    """The server actor handle verl's load balancer hands out (``generate.remote``)."""

    def __init__(self, fake):
        self.generate = SimpleNamespace(
            remote=lambda request_id, prompt_ids, sampling_params: fake._answer(
                request_id, prompt_ids, sampling_params
            )
        )


#: the example's info as prepare-data writes it (JSON): one hop, so GEAR's tau* searches "author of X" and answers
EXAMPLE_INFO = json.dumps({"supporting_titles": ["author of X"]})


def _run_loop(
    tokenizer,
    method_config,
    server,
    overrides=(),
    tools=None,
    example_info=EXAMPLE_INFO,
    question="who wrote X",
    answers=("Jane Doe", "J. Doe"),
    runtime=None,
    **sample,
):
    """Run the registered agent loop on one row; ``tools`` (a dict) or ``runtime`` (a ToolRuntime) replace the
    worker's tools."""
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(method_config, overrides=["data.max_response_length=400", *overrides])
    answers = list(answers)
    # the protocol prepare-data records in each row (the run's own unless a test passes another; None: no record)
    tag = sample.pop(
        "protocol", protocol_tag(cfg.agentcredit.protocol, dict(cfg.agentcredit.protocol_options))
    )
    protocol = get_protocol(cfg.agentcredit.protocol, **cfg.agentcredit.protocol_options)
    messages = protocol.messages(protocol.new_episode(question))
    agent_loop_module._RUNTIMES.clear()
    signals_module._REFERENCES.clear()

    async def post(url, payload):
        return server.sglang_generate(url, payload)

    scoring_module._http_post, saved_post = post, scoring_module._http_post
    if tools is not None or runtime is not None:  # no retrieval server here: give the worker local tools
        key = agent_loop_module.runtime_key(agent_loop_module.load_settings(cfg.agentcredit))
        agent_loop_module._RUNTIMES[key] = runtime if runtime is not None else ToolRuntime(tools)

    async def main():
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[AGENT_LOOP_NAME],
            trainer_config=DictConfigWrap(config=cfg),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([]),
        )
        return await loop.run(
            {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
            raw_prompt=messages,
            extra_info={
                "question": question,
                "answers": answers,
                "index": 0,
                "example_info": example_info,
                "protocol": tag,
            },
            reward_model={"style": "rule", "ground_truth": answers},
            **sample,
        )

    try:
        return asyncio.run(main())
    finally:
        scoring_module._http_post = saved_post


SEARCH = {"search": lambda a: f"Doc 1 Jane Doe wrote {a['query']}"}


def test_a_row_prompted_for_another_protocol_is_refused(byte_tokenizer):
    """issue 51: carl-segment parses code fences; a row written for GRPO's tags prompt would be read with the wrong
    parser (reward ~ 0, no error). The row's recorded protocol is checked against the run's."""
    server = FakeServer(byte_tokenizer, ["<answer>Jane Doe</answer>"])
    tags = protocol_tag("tags", {"style": "search-r1"})
    with pytest.raises(
        ValueError, match=r"dataset row 0: prompts rendered for protocol .*tags.* parse .*codefence"
    ):
        _run_loop(byte_tokenizer, "carl_segment", server, tools=SEARCH, protocol=tags)
    with pytest.raises(ValueError, match=r"extra_info.protocol is missing"):
        _run_loop(byte_tokenizer, "grpo", server, tools=SEARCH, protocol=None)
    assert server.request_ids == []  # refused before the first generate call


def test_grpo_loop_returns_one_output_with_the_record(byte_tokenizer):
    server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
    out = _run_loop(byte_tokenizer, "grpo", server, tools=SEARCH)
    assert isinstance(out, AgentLoopOutput)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert out.reward_score == 1.0 == rec.outcome and rec.answer == "Jane Doe"
    assert rec.segment_kinds == ["search", "answer"] and rec.tool_turns == [0]
    assert [s.kind for s in rec.spans] == ["search", "information", "answer"]
    assert sum(out.response_mask) == sum(s.end - s.start for s in rec.spans if s.trained)
    assert out.response_logprobs == [-0.25 if m else 0.0 for m in out.response_mask]
    assert server.scored == []  # grpo asks the server for no teacher scores
    assert rec.teacher_calls == {}
    # the weight versions the episode was sampled with, for verl's staleness tags and metrics
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (7, 8)


CURRENT_POLICY_TEACHER = ["agentcredit.tips.refresh_every=1"]  # the rollout server scores the potentials


def test_tips_loop_records_teacher_potentials_at_each_boundary(byte_tokenizer):
    """The shipped tips config: TIPS's own style (Qwen tool calls, <tool_response> user turns)."""
    call = '<tool_call>{"name": "search", "arguments": {"query_list": ["author of X"]}}</tool_call>'
    server = FakeServer(byte_tokenizer, [call, "<answer>Jane Doe</answer>"])
    out = _run_loop(byte_tokenizer, "tips", server, overrides=CURRENT_POLICY_TEACHER, tools=SEARCH)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert rec.tool_turns == [0] and out.response_ids.count(byte_tokenizer.eos_token_id) >= 2
    obs = next(s for s in rec.spans if s.role == "observation")
    assert "<tool_response>" in byte_tokenizer.decode(out.response_ids[obs.start : obs.end])
    assert rec.potentials is not None and len(rec.potentials) == 2  # Phi(S_0), Phi(S_1)
    # 2 boundaries x 2 aliases scored, each = boundary context + "<answer>" (forced) + the alias (scored: Eq. 15-16)
    assert len(server.scored) == 4
    # counted in the record, for agentcredit/teacher_requests and teacher_resent_frac
    assert rec.teacher_calls == {"requests": 4, "resent": 0}
    assert out.reward_score == pytest.approx(1.2)  # EM + TIPS's 0.2 format bonus
    # with log p(token j) = -0.001 j, Phi(S) = logsumexp over aliases of -0.001 * sum of the answer positions
    import math

    def phi(full_lengths):
        return math.log(sum(math.exp(-0.001 * sum(range(n - m, n))) for n, m in full_lengths))

    n_ans = [len(byte_tokenizer.encode(a, add_special_tokens=False)) for a in ("Jane Doe", "J. Doe")]
    lens = [len(c) for c in server.scored]
    assert rec.potentials == pytest.approx(
        [phi(zip(lens[:2], n_ans, strict=True)), phi(zip(lens[2:], n_ans, strict=True))], rel=1e-9
    )


def test_gear_loop_records_teacher_logprobs_per_response_token(byte_tokenizer):
    server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
    out = _run_loop(byte_tokenizer, "gear", server, tools=SEARCH)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert len(rec.teacher_logprobs) == len(out.response_ids)
    (scored,) = server.scored
    assert rec.teacher_calls == {"requests": 1, "resent": 0}
    # the teacher sequence is the ground-truth-conditioned prompt followed by exactly the student's response tokens
    assert scored[-len(out.response_ids) :] == out.response_ids
    # the ground truth is tau* (GEAR §3.3): the task's demonstration played through the worker's search tool
    teacher_prompt = byte_tokenizer.decode(scored[: -len(out.response_ids)])
    assert (
        "Here is a reference solution:\n<think>I need information about author of X.</think>"
        in teacher_prompt
    )
    assert (
        "<search>author of X</search>" in teacher_prompt
        and "Doc 1 Jane Doe wrote author of X" in teacher_prompt
    )
    assert "<answer>Jane Doe</answer>\n\nAfter understanding the reference solution" in teacher_prompt


def test_gear_answer_variant_renders_the_answer_as_the_native_trainer(byte_tokenizer):
    server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
    out = _run_loop(byte_tokenizer, "gear", server, ["agentcredit.gear.reference=answer"], tools=SEARCH)
    (scored,) = server.scored
    teacher_prompt = byte_tokenizer.decode(scored[: -len(out.response_ids)])
    # gear_ground_truth: the protocol's rendering of the first gold answer, no demonstration
    assert "Here is a reference solution:\n<answer>Jane Doe</answer>\n\nAfter" in teacher_prompt
    assert "<search>author of X</search>" not in teacher_prompt


def test_gear_reference_needs_the_examples_info(byte_tokenizer):
    """Without the example's info the demonstration would answer directly (a tau* with no search): refused."""
    server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
    with pytest.raises(ValueError, match="prepare-data.*agentcredit.gear.reference=answer"):
        _run_loop(byte_tokenizer, "gear", server, tools=SEARCH, example_info=None)


def test_gear_reference_whose_tool_cannot_run_leaves_the_episode_out(byte_tokenizer):
    """tau* is played through the worker's tools; a search that cannot run there is an infrastructure failure of
    the episode (as its own would be): not scored by the teacher, nothing trained."""
    from agentcredit.tools.base import unavailable

    def search(a):
        if a["query"] == "author of X":  # the demonstration's hop, not the student's query
            return unavailable("search failed (http://retriever:8000/retrieve, timeout 30 s): timed out")
        return f"Doc 1 Jane Doe wrote {a['query']}"

    server = FakeServer(byte_tokenizer, ["<search>who wrote X</search>", "<answer>Jane Doe</answer>"])
    out = _run_loop(byte_tokenizer, "gear", server, tools={"search": search})
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert server.scored == [] and sum(out.response_mask) == 0
    assert len(rec.infra_failures) == 1 and rec.infra_failures[0].startswith(
        "the teacher's reference trajectory:"
    )


def test_carl_segment_loop_returns_one_output_per_view(byte_tokenizer):
    texts = [
        "I search.\n```python\nprint(search('X'))\n```",
        "<context>Jane Doe</context>",
        "\\boxed{Jane Doe}",
    ]
    server = FakeServer(byte_tokenizer, texts)
    outs = _run_loop(byte_tokenizer, "carl_segment", server, tools={"python": lambda a: "Jane Doe wrote X"})
    assert isinstance(outs, list) and len(outs) == 2
    recs = [RowRecord.model_validate(o.extra_fields["agentcredit"]) for o in outs]
    assert [r.view for r in recs] == [0, 1] and recs[0].episode_id == recs[1].episode_id
    assert all(o.reward_score == 1.0 for o in outs)
    assert [s.kind for s in recs[0].spans] == ["invoke", "tool_output", "assimilate"]
    assert [s.kind for s in recs[1].spans] == ["invoke", "assimilate", "commit"]


TIPS_TURNS = [
    '<tool_call>{"name": "search", "arguments": {"query_list": ["X"]}}</tool_call>',
    "<answer>Jane Doe</answer>",
]


def test_every_request_of_an_episode_carries_one_routing_id(byte_tokenizer):
    """verl's load balancer keeps a request id on one replica (sticky session), where the prefix is cached."""
    servers = [FakeServer(byte_tokenizer, TIPS_TURNS) for _ in range(2)]
    for server in servers:
        _run_loop(byte_tokenizer, "tips", server, overrides=CURRENT_POLICY_TEACHER, tools=SEARCH)
    for server in servers:
        assert len(server.request_ids) == 2 and len(server.score_ids) == 4
        # the teacher scores prefixes of the episode: the same replica has them cached
        assert set(server.request_ids) == set(server.score_ids) == {server.request_ids[0]}
    assert servers[0].request_ids[0] != servers[1].request_ids[0]  # episodes spread over the replicas


def test_full_determinism_routes_by_priority_as_verls_tool_agent_loop(byte_tokenizer):
    """verl then hands the id to vLLM unchanged, so concurrent teacher requests need ids of their own."""
    server = FakeServer(byte_tokenizer, TIPS_TURNS)
    overrides = ["actor_rollout_ref.rollout.full_determinism=true", *CURRENT_POLICY_TEACHER]
    _run_loop(byte_tokenizer, "tips", server, overrides=overrides, tools=SEARCH, priority=3)
    assert server.request_ids == ["det-3", "det-3"]
    assert len(set(server.score_ids)) == 4 and all(i.startswith("det-3-") for i in server.score_ids)
    # issue 51: the scores' own ids went to the load balancer too, scattering them away from the episode's cache
    assert set(server.routes) == {"det-3"} and len(server.routes) == 6
    # verl's V1 workers pass no priority: a shared det-0 would be one vLLM id for concurrent episodes
    assert agent_loop_module.episode_request_id(True) != agent_loop_module.episode_request_id(True)


def test_full_determinism_on_verls_v1_workers_gives_ids_that_repeat(byte_tokenizer):
    """issue 51: without a priority (verl's V1 TransferQueue workers) every episode got a uuid4, so a rerun sent
    other ids (and other seeds). The id is the step, the dataset row and the session; the seeds follow from it."""
    runs = []
    for _ in range(2):
        server = FakeServer(byte_tokenizer, TIPS_TURNS)
        overrides = ["actor_rollout_ref.rollout.full_determinism=true", *CURRENT_POLICY_TEACHER]
        _run_loop(byte_tokenizer, "tips", server, overrides, tools=SEARCH, global_steps=4, session_id=2)
        runs.append((server.request_ids, server.score_ids, server.seeds))
    assert runs[0] == runs[1] and runs[0][0] == ["det-4-0-2", "det-4-0-2"]
    seeds = runs[0][2]
    assert None not in seeds and seeds[0] != seeds[1]  # a seed per turn
    sample = {"global_steps": 4, "index": 0}
    other = agent_loop_module.episode_request_id(True, None, {**sample, "session_id": 3})
    assert other == "det-4-0-3"  # the next of the prompt's rollout.n sessions
    # verl seeds every request of a replica alike (rank + seed): the sessions of one prompt would sample alike
    assert agent_loop_module.request_seed(0, "det-4-0-2", 0) != agent_loop_module.request_seed(0, other, 0)


def test_sglang_scoring_names_the_actors_lora_adapter(byte_tokenizer):
    """issue 51: verl's SGLang server serves a LoRA actor as an adapter and names it on every generate request; the
    scorer's direct /generate call did not, so GEAR's teacher would have been the base model."""
    overrides = ["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.model.lora_rank=16"]
    for extra, want in (([], "verl_actor_lora_name"), (["actor_rollout_ref.model.lora_rank=0"], None)):
        server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
        _run_loop(byte_tokenizer, "gear", server, overrides=[*overrides, *extra], tools=SEARCH)
        assert server.posts and all(p.get("lora_path") == want for _, p in server.posts)


@pytest.mark.parametrize(("engine", "method"), [("sglang", "tips"), ("sglang", "gear"), ("vllm", "gear")])
def test_scoring_requests_fit_each_engine(byte_tokenizer, engine, method):
    """issue 36: every prompt-logprob request sent "detokenize": False, which SGLang's SamplingParams rejects, so
    TIPS and GEAR scoring raised on SGLang. Now vLLM gets a prompt-logprob request that reads the prefix cache
    (with detokenize off), and SGLang a /generate request of its own with logprob_start_len at the scored span
    (agentcredit/integrations/verl/scoring.py): no verl generate call carries SGLang a key it refuses."""
    turns = TIPS_TURNS if method == "tips" else ["<search>author of X</search>", "<answer>Jane Doe</answer>"]
    server = FakeServer(byte_tokenizer, turns)
    overrides = [f"actor_rollout_ref.rollout.name={engine}"]
    overrides += CURRENT_POLICY_TEACHER if method == "tips" else []
    out = _run_loop(byte_tokenizer, method, server, overrides=overrides, tools=SEARCH)
    if engine == "sglang":
        assert server.score_params == [] and server.posts
        for url, payload in server.posts:
            assert url == "http://10.0.0.7:30000/generate"
            assert payload["return_logprob"] is True and 1 <= payload["logprob_start_len"] < len(
                payload["input_ids"]
            )
            assert set(payload["sampling_params"]) == {"max_new_tokens", "temperature"}
    else:
        assert server.score_params and server.posts == []
        for params in server.score_params:
            assert params["detokenize"] is False and params["prompt_logprobs"] == 0
            assert params["skip_reading_prefix_cache"] is False
    # the same numbers on either engine: log p(token j) = -0.001 * j of the teacher sequence
    if method == "gear":
        rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
        (scored,) = server.scored
        n = len(out.response_ids)
        assert rec.teacher_logprobs == pytest.approx(
            [-0.001 * j for j in range(len(scored) - n, len(scored))]
        )


def test_a_tool_that_cannot_run_ends_the_episode_unseen_and_untrained(byte_tokenizer):
    """issue 36: a search timeout is an infrastructure failure, not an answer: the model never reads
    `ERROR: search failed` (no further turn is generated), the episode is marked and nothing of it is trained."""
    from agentcredit.tools.base import unavailable

    server = FakeServer(byte_tokenizer, ["<search>author of X</search>", "<answer>Jane Doe</answer>"])
    down = {
        "search": lambda a: unavailable(
            "search failed (http://retriever:8000/retrieve, timeout 30 s): timed out"
        )
    }
    out = _run_loop(byte_tokenizer, "grpo", server, tools=down)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert len(server.request_ids) == 1 and server.texts == ["<answer>Jane Doe</answer>"]
    assert rec.infra_failures == [
        "search: ERROR: search failed (http://retriever:8000/retrieve, timeout 30 s): timed out"
    ]
    assert sum(out.response_mask) == 0 and not any(s.trained for s in rec.spans)
    assert out.reward_score == 0.0 and rec.segment_kinds == ["search"]
    assert "ERROR" not in byte_tokenizer.decode(out.response_ids)


def test_missing_question_is_a_clear_error():
    with pytest.raises(ValueError, match="extra_info.question is missing"):
        agent_loop_module.sample_fields({"raw_prompt": [], "extra_info": {}})
    with pytest.raises(ValueError, match="return_raw_chat"):
        agent_loop_module.sample_fields({})


USER_CODE = '''
def lookup(title: str) -> str:
    """Who wrote a book.

    Args:
        title: the book's title
    """
    return f"{title} was written by Jane Doe."


def score(data_source, solution_str, ground_truth, extra_info):
    calls.append((data_source, solution_str, ground_truth, extra_info))
    return {"score": 0.75 if ground_truth[0] in solution_str else 0.0}


calls = []
'''


def test_chat_protocol_with_your_tools_and_reward_as_on_the_native_trainer(
    byte_tokenizer, tmp_path, monkeypatch
):
    """Issue 15 on verl: tools.functions shown by the chat protocol (its prompt rendered in the loop), run in the
    worker's runtime, and the episode scored by agentcredit.reward with verl's signature on the episode's text."""
    (tmp_path / "my_agent.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_agent

    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, "Jane Doe"])
    overrides = [
        "agentcredit.protocol=chat",
        "~agentcredit.protocol_options.style",
        "+agentcredit.tools.functions=[my_agent:lookup]",
        "+agentcredit.reward=my_agent:score",
    ]
    out = _run_loop(byte_tokenizer, "grpo", server, overrides)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert rec.segment_kinds == ["invoke", "commit"] and rec.answer == "Jane Doe"
    prompt = byte_tokenizer.decode(out.prompt_ids)
    assert (
        '"name": "lookup"' in prompt and "<tool_call>" in prompt
    )  # the tool is shown (Hermes system message)
    response = byte_tokenizer.decode(out.response_ids)
    assert "X was written by Jane Doe." in response  # the tool ran in the worker
    source, solution, truth, extra = my_agent.calls[-1]
    assert out.reward_score == 0.75 == rec.outcome and truth == ["Jane Doe", "J. Doe"]
    # solution_str: the episode's text after the prompt (messages and tool results), as on the native trainer
    assert (
        solution.startswith(call)
        and "X was written by Jane Doe." in solution
        and solution.endswith("Jane Doe")
    )
    assert "who wrote X" not in solution and extra["index"] == 0


ENV_CODE = '''
from agentcredit.tools.episodes import ToolEnv

log = []


class Library(ToolEnv):
    tools = ("lookup",)

    def reset(self, example):
        self.example = example
        log.append(("reset", example.question))

    def lookup(self, title: str) -> str:
        """Who wrote a book.

        Args:
            title: the book's title
        """
        return f"{title} was written by Jane Doe."

    def step(self, calls):
        observations, done, _ = super().step(calls)
        return observations, done, 0.5

    def close(self):
        log.append(("close", self.example.question))
'''


def test_a_per_episode_environment_on_verl_as_on_the_native_trainer(byte_tokenizer, tmp_path, monkeypatch):
    """agentcredit.tools.environment: one environment per episode in the worker (reset on the row's example,
    closed after it), its schema shown by the chat protocol, its step reward in the record and in the return."""
    (tmp_path / "my_library_env.py").write_text(ENV_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_library_env

    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, "Jane Doe"])
    overrides = [
        "agentcredit.protocol=chat",
        "~agentcredit.protocol_options.style",
        "+agentcredit.tools.environment=my_library_env:Library",
        "agentcredit.tools.search_url=null",  # the environment owns every tool
    ]
    out = _run_loop(byte_tokenizer, "ppo", server, overrides)
    rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
    assert rec.segment_kinds == ["invoke", "commit"] and rec.answer == "Jane Doe"
    assert '"name": "lookup"' in byte_tokenizer.decode(out.prompt_ids)
    assert "X was written by Jane Doe." in byte_tokenizer.decode(out.response_ids)
    assert my_library_env.log == [("reset", "who wrote X"), ("close", "who wrote X")]
    assert rec.env_rewards == [0.5, 0.0]
    assert out.reward_score == rec.outcome == 1.5  # exact match 1.0 plus the step reward


def test_portool_grows_its_tree_in_one_session_with_one_output_per_leaf(
    byte_tokenizer, tmp_path, monkeypatch
):
    """issue 16 item 6: agentcredit.tree runs the native PORTool strategy inside the agent loop. Round 1 starts n
    paths (one call each), DupAndSamp continues them; the identical first calls merge into one node, so both
    leaves' records name the same first step, and every request of the tree carries one routing id."""
    (tmp_path / "my_tree_agent.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, call, "Jane Doe", "Jane Doe"])
    overrides = [
        "agentcredit.protocol=chat",
        "agentcredit.tools.suite=false",
        "+agentcredit.tools.functions=[my_tree_agent:lookup]",
        "agentcredit.tree.n=2",
        "agentcredit.tree.t_max=2",
        "actor_rollout_ref.rollout.n=2",
    ]
    outs = _run_loop(byte_tokenizer, "portool", server, overrides)
    assert isinstance(outs, list) and len(outs) == 2  # one per leaf
    recs = [RowRecord.model_validate(o.extra_fields["agentcredit"]) for o in outs]
    assert recs[0].tree_id is not None and recs[0].tree_id == recs[1].tree_id
    assert [r.segment_kinds for r in recs] == [["invoke", "commit"]] * 2
    assert recs[0].step_nodes[0] == recs[1].step_nodes[0]  # the merged first call
    assert recs[0].step_nodes[1] != recs[1].step_nodes[1]  # two answers: two leaves
    assert [o.reward_score for o in outs] == [1.0, 1.0]
    assert len(server.request_ids) == 4 and len(set(server.request_ids)) == 1  # one routing id per tree


def test_tree_branches_get_request_ids_of_their_own_under_full_determinism(
    byte_tokenizer, tmp_path, monkeypatch
):
    """issue 36: a tree's branches run concurrently; under rollout.full_determinism verl passes the request id to
    vLLM unchanged, so one shared id would collide there. Each branch (job) gets its own suffix; the requests of
    one branch keep theirs (they run one after another, as an episode's turns)."""
    (tmp_path / "my_det_tree_agent.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, call, "Jane Doe", "Jane Doe"])
    overrides = [
        "agentcredit.protocol=chat",
        "agentcredit.tools.suite=false",
        "+agentcredit.tools.functions=[my_det_tree_agent:lookup]",
        "agentcredit.tree.n=2",
        "agentcredit.tree.t_max=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.full_determinism=true",
    ]
    outs = _run_loop(byte_tokenizer, "portool", server, overrides, priority=3)
    assert len(outs) == 2 and len(server.request_ids) == 4
    assert all(i.startswith("det-3-branch") for i in server.request_ids)
    # round 1: two concurrent paths, each with an id of its own
    assert len(set(server.request_ids[:2])) == 2
    # issue 51: ...routed by the tree's id (one replica's prefix cache), and sampled with seeds of their own: verl's
    # one seed per replica would make PORTool's duplicated paths sample the same tokens from the same context
    assert set(server.routes) == {"det-3"}
    assert len(set(server.seeds[:2])) == 2 and None not in server.seeds
    recs = [RowRecord.model_validate(o.extra_fields["agentcredit"]) for o in outs]
    assert recs[0].tree_id == "det-3-tree"
    assert agent_loop_module.branch_request_id("det-3", 1, True) == "det-3-branch1"
    assert agent_loop_module.branch_request_id("det-3", None, True) == "det-3"  # one episode: verl's id
    assert agent_loop_module.branch_request_id("abc", 1, False) == "abc"  # shared: the tree's cache routing


def test_greedy_requests_get_one_episode_even_under_a_tree_strategy():
    """verl's validation samples greedily: a tree of identical greedy branches would say nothing more."""
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("portool")
    settings = agent_loop_module.load_settings(cfg.agentcredit)
    assert (
        settings.tree.strategy == "step_forks" and cfg.actor_rollout_ref.rollout.n == settings.tree.leaves()
    )
    assert agent_loop_module.grows_tree(settings, {"temperature": 1.0})
    assert not agent_loop_module.grows_tree(settings, {"temperature": 0})


def test_carl_critical_forks_its_tree_in_one_session(byte_tokenizer, tmp_path, monkeypatch):
    """The entropy-guided tree: N0 = 1 episode, then N = 1 fork from the state of largest H(s)/n(s). Every action
    here has the same entropy (the server's log-probs are all -0.25), so the tie goes to the shallower state: the
    root, and the fork is a second whole episode of the same tree."""
    (tmp_path / "my_fork_agent.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, "Jane Doe", call, "J. Doe"])
    overrides = [
        "agentcredit.protocol=chat",
        "~agentcredit.protocol_options.style",
        "+agentcredit.tools.functions=[my_fork_agent:lookup]",
        "agentcredit.tools.search_url=null",
        "agentcredit.tree.n0=1",
        "agentcredit.tree.n=1",
        "actor_rollout_ref.rollout.n=2",
    ]
    outs = _run_loop(byte_tokenizer, "carl_critical", server, overrides)
    recs = [RowRecord.model_validate(o.extra_fields["agentcredit"]) for o in outs]
    assert len(recs) == 2 and recs[0].tree_id == recs[1].tree_id
    assert [r.answer for r in recs] == ["Jane Doe", "J. Doe"]
    assert not set(recs[0].step_nodes) & set(recs[1].step_nodes)  # forked at the root: no shared step
    assert recs[0].fork_counts == recs[1].fork_counts == {0: 1}  # for the forked_parent update rule
    assert server.texts == [] and len(set(server.request_ids)) == 1


def test_verls_worker_stores_every_leaf_of_a_tree(byte_tokenizer, tmp_path, monkeypatch):
    """The tree's list of outputs through verl's own TQ worker post-processing (AgentLoopWorkerTQ.
    _agent_loop_postprocess): one TransferQueue row per leaf under {uid}_{session}_{i}, each with its record, and
    verl's copy of the last output's reward_score onto the others (which the trainer's advantage step undoes in
    rm_scores; tests/integrations/test_verl_trainer.py). The worker is the real class without its Ray actor and
    model set-up (it needs neither to post-process): processor None, no distillation, no reward workers."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    (tmp_path / "my_tq_agent.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"title": "X"}}\n</tool_call>'
    server = FakeServer(byte_tokenizer, [call, call, "Jane Doe", "Nobody"])
    overrides = [
        "agentcredit.protocol=chat",
        "agentcredit.tools.suite=false",
        "+agentcredit.tools.functions=[my_tq_agent:lookup]",
        "agentcredit.tree.n=2",
        "agentcredit.tree.t_max=2",
        "actor_rollout_ref.rollout.n=2",
    ]
    outs = _run_loop(byte_tokenizer, "portool", server, overrides, global_steps=3)
    assert [o.reward_score for o in outs] == [1.0, -1.0]  # PORTool's judge-free rule: wrong = -1

    stored = {}

    async def kv_batch_put(keys, fields, tags, partition_id):
        stored.update({k: (fields[i], t) for i, (k, t) in enumerate(zip(keys, tags, strict=True))})

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.processor = None, False, None
    asyncio.run(worker._agent_loop_postprocess(outs, False, uid="u1", session_id=0, global_steps=3))
    assert sorted(stored) == ["u1_0_0", "u1_0_1"]
    records = [RowRecord.model_validate(stored[k][0]["extra_fields"]["agentcredit"]) for k in sorted(stored)]
    assert [r.outcome for r in records] == [1.0, -1.0] and records[0].tree_id == records[1].tree_id
    assert [float(stored[k][0]["rm_scores"].sum()) for k in sorted(stored)] == [-1.0, -1.0]  # verl's copy
    assert all(stored[k][1]["status"] == "success" for k in stored)


def test_portool_unfinished_reward_is_the_native_setting():
    """An episode cut at the step cap (no answer) gets agentcredit.portool.unfinished_reward on verl too (issue 31:
    -1 by default, portool.md 8.13), the same field as the native algorithm.portool section."""
    settings = agent_loop_module.load_settings({"method": "portool"})
    assert agent_loop_module.episode_outcome(settings, None, ["Paris"]) == -1.0
    assert agent_loop_module.episode_outcome(settings, "Paris", ["Paris"]) == 1.0
    zero = agent_loop_module.load_settings({"method": "portool", "portool": {"unfinished_reward": 0.0}})
    assert agent_loop_module.episode_outcome(zero, None, ["Paris"]) == 0.0


@pytest.fixture
def toy_signal_method():
    """A user's method that needs a signal of its own, registered from this file without touching the package:
    the signal (``register_signal``), the method reading it, and the scorer that computes it on verl's workers
    (``register_signal_scorer``). The scorer asks the rollout server (a teacher call, counted in the record) for the
    log-probs of the episode's answer after its prompt and sums them; the method's advantage of every token of an
    episode is that sum."""
    from agentcredit.credit import Estimate, Method, Needs, register_method, register_signal
    from agentcredit.credit.methods import NoSettings, unregister_method, unregister_signal
    from agentcredit.integrations.verl.signals import register_signal_scorer, unregister_signal_scorer

    register_signal(
        "toy_answer_logp", "per episode, the policy's summed log-prob of its answer after the prompt"
    )

    def estimate(batch, settings):
        values = batch.per_episode("toy_answer_logp", "toy-answer")
        per_step = [[float(v)] * len(ep.steps) for ep, v in zip(batch.episodes, values, strict=True)]
        return Estimate(batch.paint_steps(per_step, batch.zeros()), batch.trained_mask())

    method = register_method(
        Method(
            name="toy-answer",
            settings=NoSettings,
            needs=Needs(signals=frozenset({"toy_answer_logp"})),
            source="a test's user method",
            estimate=estimate,
        )
    )

    async def score(ctx):
        answer = ctx.tokenizer.encode(ctx.episode.answer or "", add_special_tokens=False)
        return float(sum(await ctx.scorer()(list(ctx.prompt_ids), answer)))

    register_signal_scorer("toy_answer_logp", score)
    try:
        yield method
    finally:
        unregister_signal_scorer("toy_answer_logp")
        unregister_method("toy-answer")
        unregister_signal("toy_answer_logp")


def test_a_users_signal_is_scored_on_the_worker_and_reaches_the_method(byte_tokenizer, toy_signal_method):
    """issue 53: verl scores a signal by its name, so a user's signal needs a scorer registered from user code
    and nothing in the package: the agent loop runs it, the record carries its value, the advantage step hands it
    to the method's layout."""
    import torch

    from agentcredit.integrations.verl.advantages import compute_advantages

    records, masks = [], []
    for answer in ("Jane Doe", "Bob"):
        server = FakeServer(byte_tokenizer, ["<search>author of X</search>", f"<answer>{answer}</answer>"])
        out = _run_loop(byte_tokenizer, "grpo", server, ["agentcredit.method=toy-answer"], tools=SEARCH)
        rec = RowRecord.model_validate(out.extra_fields["agentcredit"])
        (scored,) = server.scored  # one teacher call: the prompt, then the answer's tokens
        n = len(byte_tokenizer.encode(answer, add_special_tokens=False))
        # log p(token j) = -0.001 * j (FakeServer): the answer's tokens are the last n of the scored sequence
        expected = sum(-0.001 * j for j in range(len(scored) - n, len(scored)))
        assert rec.signals == {"toy_answer_logp": pytest.approx(expected)}
        assert rec.teacher_calls == {"requests": 1, "resent": 0}
        records.append(rec)
        masks.append(out.response_mask)
    width = max(len(m) for m in masks)
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    settings = agent_loop_module.load_settings({"method": "toy-answer"})
    result = compute_advantages(settings, response_mask=mask, records=records, uids=["p0", "p0"])
    for row, rec in enumerate(records):
        trained = result.advantages[row][mask[row].bool()]
        assert torch.allclose(trained, torch.full_like(trained, rec.signals["toy_answer_logp"]))
