"""The rollout engine on tiny Llamas: recorded log-probs, budgets, stops, batching, seeding, prefix reuse."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from rollout_helpers import DEMOS, EOS, demo_tree, greedy_engine, make_tools, teacher_forced

from agentcredit.protocols import get_protocol
from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import independent
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tools.base import ToolRuntime

DEMO = {demo.name: demo for demo in DEMOS}


def engine_for(model, tokenizer, protocol, tools=None, **config) -> RolloutEngine:
    config.setdefault("max_segment_tokens", 60)
    config.setdefault("max_episode_tokens", 200)
    return RolloutEngine(HFBackend(model), tokenizer, protocol, tools, EngineConfig(**config))


def exact_match(answer: str):
    return lambda item, got: float(got == answer)


def max_logprob_error(model, trees: list[RolloutTree], temperature: float) -> tuple[float, float, int]:
    """Largest |recorded - teacher-forced| over all policy tokens (log-probs, entropies) and the view count."""
    worst_lp = worst_ent = 0.0
    views = 0
    for tree in trees:
        for leaf in tree.leaves():
            for view in tree.training_views(leaf):
                views += 1
                logprobs, entropies = teacher_forced(model, view.token_ids, temperature, view.policy_mask)
                mask = torch.tensor(view.policy_mask)
                assert mask.any()
                worst_lp = max(
                    worst_lp, (logprobs[mask] - torch.tensor(view.logprobs)[mask]).abs().max().item()
                )
                worst_ent = max(
                    worst_ent, (entropies[mask] - torch.tensor(view.entropies)[mask]).abs().max().item()
                )
    return worst_lp, worst_ent, views


@pytest.mark.parametrize("name", list(DEMO))
def test_recorded_logprobs_equal_one_teacher_forced_pass(trained_tiny, tools, name):
    """Every protocol (and carl-segment's replacement mode): behaviour log-probs = a fresh forward pass."""
    model, tokenizer = trained_tiny
    demo = DEMO[name]
    engine = engine_for(model, tokenizer, demo.build_protocol(), tools, seed=3)
    trees = engine.run([demo.question, demo.question + " Quick."], independent(3), exact_match(demo.answer))
    assert engine.stats.tool_calls >= 1, (
        "the overfit model should call tools: the test needs real observations"
    )
    assert any(tree.segment(n).role == "observation" for tree in trees for n in range(len(tree)))
    if name == "codefence-replace":
        assert engine.stats.splices >= 1
    worst_lp, worst_ent, views = max_logprob_error(model, trees, 1.0)
    assert worst_lp < 1e-4 and worst_ent < 1e-4, (worst_lp, worst_ent)
    assert views >= 6


def test_logprobs_at_temperature_with_top_p(trained_tiny, tools):
    model, tokenizer = trained_tiny
    demo = DEMO["codefence-replace"]
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=50)
    engine = engine_for(model, tokenizer, demo.build_protocol(), tools, sampling=sampling)
    trees = engine.run([demo.question], independent(4), exact_match(demo.answer))
    worst_lp, worst_ent, _ = max_logprob_error(model, trees, 0.7)
    assert worst_lp < 1e-4 and worst_ent < 1e-4


def test_greedy_reproduces_each_demonstration_segment_by_segment(trained_tiny, tools):
    """Stops detected on decoded text across token boundaries, EOS kept in the segment, splices in place."""
    model, tokenizer = trained_tiny
    for demo in DEMOS:
        engine = engine_for(
            model, tokenizer, demo.build_protocol(), tools, sampling=SamplingParams(temperature=0)
        )
        (tree,) = engine.run([demo.question], independent(1), exact_match(demo.answer))
        (leaf,) = tree.leaves()
        path = [tree.segment(n) for n in tree.path(leaf)]
        texts = [seg.text for seg in path if seg.role == "policy"]
        assert texts == demo.texts, demo.name
        assert tree.rewards() == {leaf: 1.0}
        assert tree.nodes[leaf].info["finish"] == "done" and tree.nodes[leaf].info["answer"] == demo.answer
        # the same tree the demonstration builds, token for token (contexts are appended ids, never re-rendered)
        expected = demo_tree(demo, tokenizer, tools)
        got = [(s.role, s.token_ids, s.transient) for s in path]
        want = [
            (expected.segment(n).role, expected.segment(n).token_ids, expected.segment(n).transient)
            for n in expected.path(expected.leaves()[0])
        ]
        assert got == want, demo.name
        for seg in path:
            if seg.role == "policy":
                assert seg.info["finish"] == ("eos" if seg.text.endswith(EOS) else "stop")
    # a stop string that is several tokens long is only visible in the decoded text
    assert len(tokenizer("</context>", add_special_tokens=False)["input_ids"]) > 1


def test_replacement_splices_the_extraction_after_the_invoke(trained_tiny, tools):
    model, tokenizer = trained_tiny
    demo = DEMO["codefence-replace"]
    engine = engine_for(
        model, tokenizer, demo.build_protocol(), tools, sampling=SamplingParams(temperature=0)
    )
    (tree,) = engine.run([demo.question], independent(1), exact_match(demo.answer))
    prompt, invoke, raw, assimilate, commit = tree.path(tree.leaves()[0])
    assert tree.segment(raw).transient and tree.segment(raw).text == "\n```output\n391\n```\n"
    assert tree.segment(assimilate).info["spliced"] is True
    first, second = tree.training_views(commit)
    assert first.token_ids[-len(tree.segment(assimilate)) :] == tree.segment(assimilate).token_ids
    ids = lambda n: tree.segment(n).token_ids  # noqa: E731
    assert second.token_ids == ids(prompt) + ids(invoke) + ids(assimilate) + ids(commit)
    # only the assimilate tokens were fed again, not the prefix: prompt + raw output + re-fed assimilate
    stats = engine.stats
    assert stats.splices == 1
    assert stats.prefill_tokens == len(ids(prompt)) + len(ids(raw)) + len(ids(assimilate)) - 1


def test_batch_of_mixed_lengths_equals_each_episode_alone(tiny):
    """Same prompt id and seed -> same tokens, batched or alone (greedy and sampled)."""
    model, tokenizer = tiny
    protocol = get_protocol("tags", style="search-r1")  # never ends by itself on a random model
    prompts = [
        "Who?",
        "What is the tallest mountain in the Alps, and how high is it exactly?",
        "Capital of Peru",
    ]
    for sampling in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=100)):
        config = dict(sampling=sampling, max_segment_tokens=7, max_episode_tokens=30, max_turns=4)
        together = engine_for(model, tokenizer, protocol, **config).run(
            prompts, independent(2), lambda *_: 0.0, prompt_ids=["a", "b", "c"], seed=11
        )
        for i, pid in enumerate("abc"):
            (alone,) = engine_for(model, tokenizer, protocol, **config).run(
                [prompts[i]], independent(2), lambda *_: 0.0, prompt_ids=[pid], seed=11
            )
            assert [s.segment.token_ids for s in alone.nodes] == [
                s.segment.token_ids for s in together[i].nodes
            ]
            for a, b in zip(alone.nodes, together[i].nodes, strict=True):
                if a.segment.role == "policy":
                    assert torch.allclose(
                        torch.tensor(a.segment.logprobs), torch.tensor(b.segment.logprobs), atol=1e-5
                    )


def test_same_seed_same_rollouts_and_successive_calls_differ(tiny):
    model, tokenizer = tiny
    protocol = get_protocol("codefence")
    make = lambda: engine_for(model, tokenizer, protocol, max_segment_tokens=12, seed=5)  # noqa: E731
    first, again = make(), make()
    ids = lambda trees: [[n.segment.token_ids for n in t.nodes] for t in trees]  # noqa: E731
    a = first.run(["Hi", "2+2?"], independent(3), lambda *_: 0.0)
    b = again.run(["Hi", "2+2?"], independent(3), lambda *_: 0.0)
    assert ids(a) == ids(b)
    c = first.run(["Hi", "2+2?"], independent(3), lambda *_: 0.0)  # the call counter changes the seed
    assert ids(c) != ids(a)
    d = first.run(["Hi", "2+2?"], independent(3), lambda *_: 0.0, seed=first._seed)
    assert ids(d) == ids(c)


def test_segment_token_budget_cuts_with_finish_length(tiny):
    model, tokenizer = tiny
    engine = engine_for(model, tokenizer, get_protocol("codefence"), max_segment_tokens=3)
    trees = engine.run(["What is 2+2?"], independent(4), lambda *_: 0.0)
    for leaf in trees[0].leaves():
        seg = trees[0].segment(leaf)
        assert len(seg) == 3 and seg.info["finish"] == "length"  # a cut commit: the protocol ends the episode
        assert trees[0].nodes[leaf].info["finish"] == "done"


def test_episode_token_budget_counts_from_the_root(tiny):
    model, tokenizer = tiny
    protocol = get_protocol(
        "tags", style="search-r1"
    )  # random text is an invalid action: the episode goes on
    engine = engine_for(model, tokenizer, protocol, max_segment_tokens=5, max_episode_tokens=12)
    (tree,) = engine.run(["Where is Lima?"], independent(2), lambda *_: 0.0)
    for leaf in tree.leaves():
        policy = [tree.segment(n) for n in tree.path(leaf) if tree.segment(n).role == "policy"]
        assert [len(s) for s in policy] == [5, 5, 2]
        assert tree.nodes[leaf].info["finish"] == "max_tokens"
        assert tree.nodes[leaf].info["generated_tokens"] == 12


def test_turn_cap(tiny):
    model, tokenizer = tiny
    engine = engine_for(
        model, tokenizer, get_protocol("tags", style="search-r1"), max_segment_tokens=4, max_turns=3
    )
    (tree,) = engine.run(["Where is Lima?"], independent(2), lambda *_: 0.0)
    for leaf in tree.leaves():
        assert tree.nodes[leaf].info["finish"] == "max_turns" and tree.nodes[leaf].info["n_turns"] == 3
        # invalid-action observations in between, none after the last segment
        roles = [tree.segment(n).role for n in tree.path(leaf)]
        assert roles == ["prompt", "policy", "observation", "policy", "observation", "policy"]


def test_context_cap(tiny):
    model, tokenizer = tiny
    protocol = get_protocol("codefence")
    prompt_len = len(
        tokenizer(protocol.prompt(protocol.new_episode("Hi"), tokenizer), add_special_tokens=False)[
            "input_ids"
        ]
    )
    engine = engine_for(model, tokenizer, protocol, max_context=prompt_len + 6)
    (tree,) = engine.run(["Hi"], independent(1), lambda *_: 0.0)
    (leaf,) = tree.leaves()
    assert len(tree.segment(leaf)) == 6 and tree.segment(leaf).info["finish"] == "length"
    with pytest.raises(ValueError, match="context cap"):
        engine_for(model, tokenizer, protocol, max_context=prompt_len).run(
            ["Hi"], independent(1), lambda *_: 0.0
        )


def test_group_members_share_the_prompt_prefill(tiny):
    model, tokenizer = tiny
    protocol = get_protocol("codefence")
    prompt_len = len(
        tokenizer(protocol.prompt(protocol.new_episode("Hi"), tokenizer), add_special_tokens=False)[
            "input_ids"
        ]
    )
    shared = engine_for(model, tokenizer, protocol, max_segment_tokens=5)
    shared.run(["Hi"], independent(4), lambda *_: 0.0)
    assert shared.stats.prefill_tokens == prompt_len and shared.stats.forks == 3
    alone = engine_for(model, tokenizer, protocol, max_segment_tokens=5, reuse_prefix=False)
    alone.run(["Hi"], independent(4), lambda *_: 0.0)
    assert alone.stats.prefill_tokens == 4 * prompt_len and alone.stats.forks == 0
    assert shared.stats.generated_tokens == alone.stats.generated_tokens == 4 * 5


def test_tools_run_while_other_episodes_decode(trained_tiny):
    """A slow tool call does not stop the batch: the backend keeps stepping while it runs."""
    model, tokenizer = trained_tiny
    demo = DEMO["codefence-replace"]
    seen: list[int] = []
    lock = threading.Lock()
    holder: dict[str, HFBackend] = {}

    def slow_python(args):
        start = holder["backend"].stats.forward_calls
        time.sleep(0.4)
        with lock:
            seen.append(holder["backend"].stats.forward_calls - start)
        return "391\n"

    runtime = ToolRuntime({"python": slow_python}, max_workers=8)
    engine = engine_for(model, tokenizer, demo.build_protocol(), runtime, seed=1)
    holder["backend"] = engine.backend
    # a long-winded question next to the demo: its episodes decode while the demo's tool call sleeps
    engine.run(
        [demo.question, "Tell me a long story about " + "many " * 5 + "dragons."],
        independent(3),
        lambda *_: 0.0,
    )
    runtime.close()
    assert seen and max(seen) > 0, seen


@pytest.mark.parametrize("name", ["codefence-keep", "jsoncall"])
def test_greedy_trees_do_not_depend_on_which_tool_finishes_first(trained_tiny, name):
    """A greedy rollout takes its tool steps in lockstep: when the first tool call finishes last (it sleeps), the
    forward passes batch the same episodes and the trees are the same as with tools that all return at once.
    Before, the episodes whose tools had finished went on alone: other batches (other fp32 logits) and a tree
    whose nodes were added in another order."""
    model, tokenizer = trained_tiny
    demo = DEMO[name]

    def rollout(first_sleeps: float):
        runtime = make_tools()
        calls = [0]
        lock = threading.Lock()
        for tool, fn in list(runtime.tools.items()):

            def timed(args, fn=fn):
                with lock:
                    first = calls[0] == 0
                    calls[0] += 1
                if first:
                    time.sleep(first_sleeps)
                return fn(args)

            runtime.tools[tool] = timed
        backend = HFBackend(model)
        batches = []
        extend = backend.extend
        backend.extend = lambda feeds: (
            batches.append(sorted((s, len(t)) for s, t in feeds.items())) or extend(feeds)
        )
        engine = greedy_engine(backend, tokenizer, demo, runtime)
        trees = engine.run([demo.question, demo.question + " Quick."], independent(2), lambda *_: 0.0)
        runtime.close()
        assert engine.stats.tool_calls >= 2
        segments = [
            (t.nodes[n].parent, t.segment(n).role, t.segment(n).token_ids, t.segment(n).logprobs)
            for t in trees
            for n in range(len(t))
        ]
        return batches, segments

    at_once, first_last = rollout(0.0), rollout(0.3)
    assert first_last[0] == at_once[0]  # the same episodes in every forward pass
    assert first_last[1] == at_once[1]  # the same trees, node for node, log-probs to the bit


def test_tool_time_is_counted_apart_from_generation_time(trained_tiny):
    """Issue 55: tool steps are timed on their threads (``tool_seconds``) and their CPU stays out of
    ``generation_cpu_seconds`` (the engine loop's thread), so tokens per CPU-second measure generation alone."""
    model, tokenizer = trained_tiny
    demo = DEMO["codefence-replace"]

    def busy_python(args):  # burns CPU on the tool thread, 0.3 s per call
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        return "391\n"

    runtime = ToolRuntime({"python": busy_python})
    engine = engine_for(model, tokenizer, demo.build_protocol(), runtime, seed=1)
    engine.run([demo.question], independent(2), lambda *_: 0.0)
    runtime.close()
    stats = engine.stats
    assert stats.tool_calls >= 1
    assert stats.tool_seconds >= 0.3 * stats.tool_calls
    # the tool threads' CPU is in the process's seconds, not in the generation's
    assert stats.cpu_seconds - stats.generation_cpu_seconds >= 0.25 * stats.tool_calls
    assert 0 < stats.generation_cpu_seconds <= stats.cpu_seconds
    assert stats.tokens_per_cpu_second == stats.generated_tokens / stats.generation_cpu_seconds
    assert stats.to_dict()["tokens_per_cpu_second"] == stats.tokens_per_cpu_second


def test_bad_inputs(tiny):
    model, tokenizer = tiny
    engine = engine_for(model, tokenizer, get_protocol("codefence"))
    with pytest.raises(ValueError, match="question"):
        engine.run([42], independent(1), lambda *_: 0.0)
    with pytest.raises(ValueError, match="unique"):
        engine.run(["a", "b"], independent(1), lambda *_: 0.0, prompt_ids=[1, 1])
    with pytest.raises(ValueError, match="max_batch"):
        EngineConfig(max_batch=0)
    with pytest.raises(ValueError, match="n must be"):
        independent(0)


def test_max_batch_counts_the_clones_waiting_for_their_leader(tiny):
    """Issue 13: with prefix sharing a group's leader is prefilled alone and its n - 1 clones fork from it after, so
    admission counted only the leaders: max_batch=4 with 6 prompts x 3 samples ran all 18 episodes at once (the
    warm-up's tier labels, 48 x 5, held 242 rows of KV cache instead of 64)."""
    model, tokenizer = tiny
    engine = engine_for(model, tokenizer, get_protocol("codefence"), max_batch=4, max_segment_tokens=8)
    rows: list[int] = []
    ensure = engine.backend.slab.ensure

    def watched(n_rows: int, width: int) -> None:
        rows.append(n_rows)
        ensure(n_rows, width)

    engine.backend.slab.ensure = watched
    trees = engine.run([f"Say {k}." for k in range(6)], independent(3), lambda *_: 0.0)
    assert sum(len(t.leaves()) for t in trees) == 18
    assert max(rows) <= 4, max(rows)  # here 3: a second group of 3 does not fit beside the first


def test_the_slab_is_allocated_once_for_the_episodes_admitted_together(tiny):
    """Issue 13: the slab used to grow one sequence at a time (8 -> 13 -> 20 -> 31 rows as the clones forked), each
    growth a new allocation and a copy of the whole cache; a profiled rollout of 32 episodes spent 8.8 of 112 s
    there. The engine now reserves rows for everything it admits before the first forward."""
    model, tokenizer = tiny
    engine = engine_for(model, tokenizer, get_protocol("codefence"), max_segment_tokens=8)
    slab = engine.backend.slab
    resize = slab._resize
    grown_rows: list[int] = []

    def watched(rows: int, width: int) -> None:
        if slab.allocated() and rows != slab.row_cap:
            grown_rows.append(rows)
        resize(rows, width)

    slab._resize = watched
    trees = engine.run([f"Say {k}." for k in range(6)], independent(4), lambda *_: 0.0)
    assert sum(len(t.leaves()) for t in trees) == 24
    assert grown_rows == [] and slab.row_cap == 24
