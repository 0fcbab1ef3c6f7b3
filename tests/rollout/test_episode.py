"""The episode state machine (agentcredit.rollout.episode) on hand-written cases.

A toy protocol keeps every number countable: a segment ends at ``.``; ``call:X.`` calls tool ``t`` with ``X``,
``ans:Y.`` answers ``Y``; the observation is ``[<output>]`` (transient when the protocol says so), and the segment
after a transient observation has a budget of 4 tokens. Tokens are characters (id = code point, 0 = EOS).
"""

from __future__ import annotations

import asyncio

import pytest

from agentcredit.protocols.base import EpisodeState, Observation, Protocol, Turn
from agentcredit.rollout.episode import (
    EpisodeLimits,
    EpisodeMachine,
    Generation,
    NodeState,
    boundaries,
    episode_end,
    first_end,
    generate_segment,
    observation_fits,
    segment_budget,
    token_finish,
    visible_nodes,
)
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolCall, ToolResult
from agentcredit.tools.episodes import StepOutcome

EOS = 0


class Chars:
    """One token per character; token 0 is EOS (decoded as nothing without special tokens)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(
            "" if (t == EOS and skip_special_tokens) else ("<eos>" if t == EOS else chr(t)) for t in ids
        )

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(ids, skip_special_tokens) for ids in batch]


class Toy(Protocol):
    name = "toy"
    max_segments = 5

    def __init__(self, transient=False):
        self.transient = transient

    def messages(self, state):
        return [{"role": "user", "content": state.question}]

    def segment_ends(self, state, text):
        return text.endswith(".")

    def stop_strings(self, state):
        return ["."]

    def max_new_tokens(self, state, default):
        after = state.extra.get("after_transient", False)
        return min(default, 4) if after else default

    def read_segment(self, state, text, finish):
        info = {"finish": finish}
        if text.startswith("call:") and text.endswith("."):
            return Turn("invoke", calls=[ToolCall("t", {"x": text[5:-1]})], info=info)
        if text.startswith("ans:") and text.endswith("."):
            return Turn("answer", done=True, answer=text[4:-1], info=info)
        return Turn("step", drop_transient=bool(state.extra.get("after_transient")), info=info)

    def record(self, state, turn, text):
        super().record(state, turn, text)
        state.extra = {**state.extra, "after_transient": False}

    def observation(self, state, turn, results):
        if not results:
            return None
        state.extra = {**state.extra, "after_transient": self.transient}
        turn.info["n_results"] = len(results)
        return Observation("[" + results[0].output + "]", transient=self.transient, kind="tool_output")

    def extract_answer(self, text):
        return None

    def render_answer(self, answer):
        return f"ans:{answer}."


def ids(text):
    return [ord(c) for c in text]


def machine(protocol=None, *, prompt="Q:", limits=None, **kw):
    protocol = protocol or Toy()
    tree = RolloutTree(Segment(ids(prompt), prompt, role="prompt", kind="prompt"))
    limits = limits or EpisodeLimits(max_segment_tokens=10, max_context=100, max_turns=5)
    state = protocol.new_episode("q")
    return EpisodeMachine(protocol, tree, 0, NodeState(state, 0), limits, encode=ids, **kw)


def end(m, text, finish="stop"):
    return m.end_segment(ids(text), text, finish, [-0.5] * len(text))


# ---------------------------------------------------------------------------------------------------------
# pure decisions


def test_visible_nodes_drop_a_transient_observation_once_a_policy_segment_followed_it():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(Segment([2]), 0)
    raw = tree.add(Segment([3], role="observation", transient=True), a)
    assert visible_nodes(tree, raw) == [0, a, raw]  # the next segment sees the raw output
    b = tree.add(Segment([4]), raw)
    assert visible_nodes(tree, b) == [0, a, b]  # then it is gone
    obs = tree.add(Segment([5], role="observation"), b)
    assert visible_nodes(tree, obs) == [0, a, b, obs]


def test_segment_budget_is_the_least_of_the_protocol_the_episode_and_the_context():
    toy, state = Toy(), EpisodeState("q")
    limits = EpisodeLimits(max_segment_tokens=10, max_context=100, max_turns=5, max_episode_tokens=30)
    assert segment_budget(toy, state, limits, generated=0, context=10) == 10  # the protocol's default
    assert segment_budget(toy, state, limits, generated=25, context=10) == 5  # 30 - 25 generated tokens left
    assert segment_budget(toy, state, limits, generated=0, context=97) == 3  # 100 - 97 context tokens left
    state.extra["after_transient"] = True
    assert segment_budget(toy, state, limits, generated=0, context=10) == 4  # the protocol lowered it
    no_episode_cap = EpisodeLimits(max_segment_tokens=10, max_context=100, max_turns=5)
    assert segment_budget(toy, state, no_episode_cap, generated=10**6, context=10) == 4


def test_a_protocol_budget_below_one_is_an_error():
    class Zero(Toy):
        def max_new_tokens(self, state, default):
            return 0

    with pytest.raises(ValueError, match="toy.max_new_tokens returned 0"):
        segment_budget(Zero(), EpisodeState("q"), EpisodeLimits(10, 100, 5), 0, 0)


def test_token_finish_checks_the_stop_token_then_the_protocol_then_the_budget():
    toy, state, stops = Toy(), EpisodeState("q"), frozenset({EOS})
    assert token_finish(toy, state, EOS, "ab.<eos>", 4, 10, stops) == "eos"  # EOS wins over everything
    assert (
        token_finish(toy, state, ord("."), "ab.", 3, 3, stops) == "stop"
    )  # the protocol's end wins over the budget
    assert token_finish(toy, state, ord("c"), "abc", 3, 3, stops) == "length"
    assert token_finish(toy, state, ord("c"), "abc", 3, 4, stops) is None


def test_first_end_cuts_a_chunk_that_ran_past_the_end():
    toy, state, tok = Toy(), EpisodeState("q"), Chars()
    assert first_end(toy, state, tok, ids("ca"), ids("ll:x. more")) == 5  # "call:x." ends after 5 new tokens
    assert first_end(toy, state, tok, [], ids("no end")) is None
    assert first_end(toy, state, tok, [], ids(".")) == 1


def test_episode_end_order_answer_turns_tokens_context():
    state, limits = EpisodeState("q"), EpisodeLimits(10, 100, 5, max_episode_tokens=50)
    state.turns = [Turn("step")] * 2
    go_on = Turn("step")
    assert episode_end(Turn("answer", done=True), state, limits, 2, 50, 100) == "done"
    assert episode_end(go_on, state, limits, 2, 50, 100) == "max_turns"  # 2 turns at a cap of 2
    assert episode_end(go_on, state, limits, 3, 50, 100) == "max_tokens"
    assert episode_end(go_on, state, limits, 3, 49, 100) == "context"
    assert episode_end(go_on, state, limits, 3, 49, 99) is None


def test_an_observation_fits_when_one_token_is_left_to_generate():
    assert observation_fits(90, 9, 100)  # 99 tokens, one left
    assert not observation_fits(90, 10, 100)


# ---------------------------------------------------------------------------------------------------------
# the machine


def test_a_tool_step_then_an_answer():
    m = machine()
    assert m.next_segment().action == "generate" and m.next_segment().budget == 10
    step = end(m, "call:7.")
    assert step.action == "tools" and step.calls == (ToolCall("t", {"x": "7"}),)
    step = m.tool_results([ToolResult("t", "49")])
    # the observation "[49]" is in the context: prompt 2 + segment 7 + observation 4 = 13 tokens
    assert step.action == "generate" and m.context_length() == 13
    assert m.context_ids() == ids("Q:call:7.[49]")
    step = end(m, "ans:49.")
    assert step.action == "end" and step.reason == "done"
    tree = m.tree
    policy, obs, answer = m.added
    assert tree.segment(policy).info == {
        "finish": "stop",
        "calls": [{"name": "t", "arguments": {"x": "7"}, "raw": ""}],
        "n_results": 1,  # turn.info as completed by observation()
        "results": [ToolResult("t", "49").to_dict()],
    }
    assert tree.segment(obs).role == "observation" and tree.segment(obs).text == "[49]"
    assert tree.nodes[answer].info == {
        "answer": "49",
        "finish": "done",
        "n_tool_calls": 1,
        "n_turns": 2,
        "generated_tokens": 14,
    }
    assert boundaries(tree, answer) == [ids("Q:"), ids("Q:call:7.[49]")]


def test_a_transient_observation_is_seen_by_one_segment_then_spliced_out():
    m = machine(Toy(transient=True))
    end(m, "call:7.")
    step = m.tool_results([ToolResult("t", "49")])
    assert step.budget == 4  # the protocol's budget after a transient observation
    assert m.context_ids() == ids("Q:call:7.[49]")
    step = end(m, "got.")  # the extraction: the raw output leaves the context
    assert m.tree.segment(m.node).info["spliced"] is True
    assert m.context_ids() == ids("Q:call:7.got.")
    assert step.action == "generate" and step.budget == 10
    end(m, "ans:49.")
    assert boundaries(m.tree, m.node) == [ids("Q:"), ids("Q:call:7.[49]")]


def test_an_infrastructure_failure_ends_the_episode_unseen():
    m = machine()
    end(m, "call:7.")
    step = m.tool_results([ToolResult("t", "sandbox died", ok=False, infra=True)])
    assert step == step.__class__("end", reason="infra")
    info = m.tree.nodes[m.node].info
    assert info["infra_failures"] == ["t: sandbox died"] and info["finish"] == "infra"
    assert [m.tree.segment(n).role for n in m.added] == ["policy"]  # no observation


def test_an_environment_that_ends_the_episode_records_its_results_unshown():
    m = machine()
    end(m, "call:7.")
    step = m.tool_results(StepOutcome([ToolResult("t", "win")], done=True, reward=0.25))
    assert step.reason == "env_done"
    info = m.tree.segment(m.node).info
    assert info["env_reward"] == 0.25 and info["results"][0]["output"] == "win" and info["n_results"] == 1
    assert len(m.added) == 1


def test_an_observation_that_does_not_fit_ends_the_episode():
    # prompt 2 + "call:7." 7 = 9; "[123456789]" is 11 tokens: 9 + 11 + 1 > 20 (10 would leave one token)
    m = machine(limits=EpisodeLimits(max_segment_tokens=10, max_context=20, max_turns=5))
    end(m, "call:7.")
    step = m.tool_results([ToolResult("t", "123456789")])
    assert step.reason == "context" and m.tree.segment(m.node).info["context_overflow"] == 11
    assert m.tree.nodes[m.node].info["answer"] is None


def test_the_context_cap_ends_the_episode_before_the_calls_run():
    m = machine(limits=EpisodeLimits(max_segment_tokens=10, max_context=9, max_turns=5))
    assert m.next_segment().budget == 7  # 9 - 2 prompt tokens
    assert end(m, "call:7.", "length").reason == "context"


def test_the_turn_cap_ends_the_episode_before_the_calls_run_and_a_job_may_lower_it():
    m = machine(max_turns=1)
    assert end(m, "call:7.").reason == "max_turns"
    assert m.tree.segment(m.node).info["calls"]  # read, not run
    m = machine(limits=EpisodeLimits(10, 100, max_turns=2), max_turns=4)  # the lower cap holds
    end(m, "call:1.")
    m.tool_results([ToolResult("t", "1")])
    assert end(m, "call:2.").reason == "max_turns"


def test_the_token_cap_ends_the_episode():
    m = machine(limits=EpisodeLimits(10, 100, 5, max_episode_tokens=9))
    assert end(m, "call:7.").action == "tools"  # 7 generated
    assert m.tool_results([ToolResult("t", "1")]).budget == 2
    assert end(m, "x.", "length").reason == "max_tokens"


def test_a_job_pauses_after_its_steps_and_a_later_job_continues_from_the_kept_state():
    states: dict[int, NodeState] = {}
    m = machine(max_steps=1, states=states)
    states[0] = m.start
    end(m, "call:7.")
    assert m.tool_results([ToolResult("t", "49")]).action == "pause"
    assert set(states) == {0, m.node} and states[m.node].generated == 7
    assert states[m.node].state.n_turns == 1 and states[m.node].state is not m.state
    later = EpisodeMachine(m.protocol, m.tree, m.node, states[m.node], m.limits, encode=ids)
    assert later.context_ids() == ids("Q:call:7.[49]") and later.generated == 7
    assert end(later, "ans:49.").reason == "done"
    assert later.tree.nodes[later.node].info["n_turns"] == 2


def test_an_empty_generation_ends_the_episode_where_it_is():
    m = machine()
    assert m.end_segment([], "", "length").reason == "empty" and m.node == 0


# ---------------------------------------------------------------------------------------------------------
# a chunk server


def test_generate_segment_goes_on_past_an_unconfirmed_stop_and_drops_what_ran_past_the_end():
    class Fussy(Toy):  # only "!." ends a segment; the server stops at any "."
        def segment_ends(self, state, text):
            return text.endswith("!.")

    chunks = [Generation(ids("a."), [-1.0, -2.0]), Generation(ids("b!.cd"), [-3.0] * 5)]
    seen = []

    async def generate(context, max_new_tokens, stops):
        seen.append((list(context), max_new_tokens, stops))
        return chunks.pop(0)

    out = asyncio.run(
        generate_segment(Fussy(), EpisodeState("q"), Chars(), generate, ids("P"), 10, frozenset({0}))
    )
    assert out == (ids("a.b!."), [-1.0, -2.0, -3.0, -3.0, -3.0], "stop")
    assert seen == [(ids("P"), 10, ["."]), (ids("Pa."), 8, ["."])]


def test_generate_segment_reports_eos_length_and_an_empty_answer():
    toy, state, tok = Toy(), EpisodeState("q"), Chars()

    def server(*outs):
        outs = list(outs)

        async def generate(context, n, stops):
            return outs.pop(0)

        return generate

    eos = frozenset({EOS})
    got = asyncio.run(
        generate_segment(toy, state, tok, server(Generation([97, EOS], [-1.0, -1.0])), [1], 10, eos)
    )
    assert got == ([97, EOS], [-1.0, -1.0], "eos")
    got = asyncio.run(generate_segment(toy, state, tok, server(Generation([97, EOS])), [1], 10, eos))
    assert got == ([97, EOS], None, "eos")  # a server without log-probs
    got = asyncio.run(
        generate_segment(toy, state, tok, server(Generation([97, 98], [-1.0, -1.0])), [1], 2, eos)
    )
    assert got == ([97, 98], [-1.0, -1.0], "length")
    got = asyncio.run(generate_segment(toy, state, tok, server(Generation([], [])), [1], 2, eos))
    assert got == ([], [], "length")


# ---------------------------------------------------------------------------------------------------------
# stepping a strategy's plan (both drivers)


def test_advance_plan_gives_the_jobs_then_the_plans_own_tree_and_refuses_an_empty_round():
    from agentcredit.rollout.engine import Job, JobResult, advance_plan

    pruned = RolloutTree(Segment([1], role="prompt"))

    def plan():
        results = yield [Job(0), Job(0, max_steps=1)]
        assert [r.end for r in results] == [3, 5]
        return pruned

    p = plan()
    step = advance_plan(p, None, "prompt 0")
    assert step.jobs == [Job(0), Job(0, max_steps=1)] and step.final is None
    done = advance_plan(p, [JobResult(Job(0), [3], 3, True), JobResult(Job(0), [5], 5, False)], "prompt 0")
    assert done.jobs == [] and done.final is pruned

    def empty():
        yield []

    with pytest.raises(ValueError, match="strategy yielded an empty job list for prompt 7"):
        advance_plan(empty(), None, "prompt 7")
