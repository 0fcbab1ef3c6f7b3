"""Strategies: fork selection, DupAndSamp, pruning and merging by hand; then the plans on the engine."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rollout_helpers import DEMOS, teacher_forced

from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, Job, JobResult, PlanContext, RolloutEngine
from agentcredit.rollout.strategies import (
    ForkRecord,
    action_entropy,
    dup_and_samp,
    entropy_guided,
    independent,
    merge_identical_siblings,
    select_forks,
    step_forks,
    update_records,
)
from agentcredit.rollout.tree import RolloutTree, Segment

DEMO = {demo.name: demo for demo in DEMOS}


def act(h: float, n_tokens: int = 2) -> Segment:
    """A policy segment whose action entropy -mean(logprobs) is exactly h."""
    return Segment(list(range(n_tokens)), role="policy", kind="step", logprobs=[-h] * n_tokens)


def obs() -> Segment:
    return Segment([7], role="observation", kind="observation")


# ------------------------------------------------------------------------------------- fork selection


def test_action_entropy_is_the_mean_negative_logprob():
    assert action_entropy([-0.5, -1.5, -1.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one token"):
        action_entropy([])


def test_running_mean_update_algorithm_1_line_18():
    record = ForkRecord(0.8, 1, 0)
    record.add(0.6)  # (0.6 + 0.8 * 1) / 2
    assert (record.entropy, record.count) == (pytest.approx(0.7), 2)
    record.add(1.0)  # (1.0 + 0.7 * 2) / 3
    assert (record.entropy, record.count) == (pytest.approx(0.8), 3)


def test_worked_example_of_the_spec():
    """carl-critical-actions.md section 4: N0 = 1, N = 3, picks s1, s2', s0; V and advantages as listed."""
    tree = RolloutTree(Segment([1], role="prompt"))
    records: dict[int, ForkRecord] = {}
    # phase 1: s0 -a1-> s1 -a2-> s2 -a3-> L1 (actions are policy nodes; states are their parents)
    a1 = tree.add(act(0.8), 0)
    s1 = tree.add(obs(), a1)
    a2 = tree.add(act(1.2), s1)
    s2 = tree.add(obs(), a2)
    a3 = tree.add(act(0.3), s2)
    update_records(records, tree, [a1, s1, a2, s2, a3])
    assert {s: (r.entropy, r.count) for s, r in records.items()} == {0: (0.8, 1), s1: (1.2, 1), s2: (0.3, 1)}
    # fork 1: priorities s0 0.8, s1 1.2, s2 0.3 -> s1; a2' (h 0.6) -> s2' -a3' (h 1.0)-> L2
    assert select_forks(records) == [s1]
    a2b = tree.add(act(0.6), s1)
    s2b = tree.add(obs(), a2b)
    a3b = tree.add(act(1.0), s2b)
    update_records(records, tree, [a2b, s2b, a3b])
    assert (records[s1].entropy, records[s1].count) == (pytest.approx(0.9), 2)  # priority 0.45
    assert (records[s2b].entropy, records[s2b].count) == (1.0, 1)
    # fork 2: s0 0.8, s1 0.45, s2 0.3, s2' 1.0 -> s2'; a3''' (h 0.4) -> L4: s2' becomes (0.7, 2), priority 0.35
    assert select_forks(records) == [s2b]
    a3c = tree.add(act(0.4), s2b)
    update_records(records, tree, [a3c])
    assert records[s2b].entropy == pytest.approx(0.7)
    # fork 3: s0 0.8 is the highest
    assert select_forks(records) == [0]


def test_ties_go_to_the_shallower_then_the_older_state():
    records = {5: ForkRecord(1.0, 2, 1), 3: ForkRecord(0.5, 1, 2), 9: ForkRecord(1.5, 3, 1)}
    assert select_forks(records) == [5]  # all 0.5: depth 1 beats depth 2, then node 5 beats node 9
    records[3].depth = 1
    assert select_forks(records) == [3]


def test_zero_entropy_is_priority_zero_and_depth_cap_excludes():
    records = {0: ForkRecord(0.0, 1, 0), 4: ForkRecord(0.2, 4, 3)}
    assert select_forks(records) == [4]  # 0.05 > 0
    assert select_forks(records, max_depth=3) == [0]  # depth-3 states cannot act when T_max = 3
    assert select_forks({4: ForkRecord(0.2, 4, 3)}, max_depth=3) == []


def test_forks_per_round_uses_virtual_counts():
    records = {1: ForkRecord(1.0, 1, 1), 2: ForkRecord(0.9, 1, 1)}
    # pick 1 (1.0); virtual n=2 -> 0.5 < 0.9: pick 2; virtual n=2 -> 0.45 < 0.5: pick 1 again
    assert select_forks(records, 3) == [1, 2, 1]
    assert records[1].count == 1  # virtual only


def test_random_fork_ablation_is_uniform_over_candidates():
    records = {s: ForkRecord(1.0, 1, 1) for s in (2, 5, 8)}
    picks = select_forks(records, 300, rng=random.Random(0), uniform=True)
    assert set(picks) == {2, 5, 8} and min(picks.count(s) for s in (2, 5, 8)) > 60
    with pytest.raises(ValueError, match="rng"):
        select_forks(records, uniform=True)


def drive(plan, respond):
    """Run a plan generator by hand: ``respond(jobs) -> results``; returns (all job lists, final tree)."""
    batches = []
    jobs = next(plan)
    while True:
        batches.append(jobs)
        try:
            jobs = plan.send(respond(jobs))
        except StopIteration as stop:
            return batches, stop.value


def test_entropy_guided_plan_replays_the_worked_example():
    tree = RolloutTree(Segment([1], role="prompt"))
    # (state -> action entropies of the continuation it produces), in the order of the example
    scripted = iter([[0.8, 1.2, 0.3], [0.6, 1.0], [0.4], [0.5]])

    def respond(jobs):
        results = []
        for job in jobs:
            node, added = job.node, []
            for i, h in enumerate(next(scripted)):
                node = tree.add(act(h), node)
                added.append(node)
                if i < 10:
                    node = tree.add(obs(), node)
                    added.append(node)
            results.append(JobResult(job, added, node, True))
        return results

    plan = entropy_guided(1, 3).plan(PlanContext(tree, random.Random(0), max_turns=10))
    batches, final = drive(plan, respond)
    # node ids: a1=1 s1=2 a2=3 s2=4 a3=5 (obs 6); fork from s1=2: a2'=7 s2'=8 a3'=9 (10); then s2'=8; then root
    assert [[j.node for j in b] for b in batches] == [[0], [2], [8], [0]]
    assert final is None and tree.info["fork_counts"] == {"0": 1, "2": 1, "8": 1}


# ------------------------------------------------------------------------------------- DupAndSamp / PORTool


@given(n_paths=st.integers(0, 12), f=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_dup_and_samp_keeps_exactly_n_and_at_most_f_per_path(n_paths, f, seed):
    counts = dup_and_samp(n_paths, f, n_paths, random.Random(seed))
    assert len(counts) == n_paths and sum(counts) == n_paths and all(0 <= c <= f for c in counts)
    if f == 1:
        assert counts == [1] * n_paths


def test_dup_and_samp_by_hand():
    # copies 0,1 -> path 0; 2,3 -> path 1; 4,5 -> path 2. Drawing copies {0, 1, 4} gives counts [2, 0, 1].
    class Fixed(random.Random):
        def sample(self, population, k):
            return [0, 1, 4]

    assert dup_and_samp(3, 2, 3, Fixed()) == [2, 0, 1]
    with pytest.raises(ValueError, match="n_select"):
        dup_and_samp(2, 2, 5, random.Random(0))


def test_step_forks_plan_bookkeeping_by_hand():
    """n = 4, f = 2, t_max = 3: one path finishes at step 1; DupAndSamp then draws 3 of 6 copies, etc."""
    tree = RolloutTree(Segment([1], role="prompt"))
    finish_at = {1: {0}, 2: set(), 3: None}  # step t: which job indices finish (None: all, the depth cap)

    def respond(jobs):
        results = []
        for i, job in enumerate(jobs):
            step = len([n for n in tree.path(job.node) if tree.segment(n).role == "policy"]) + 1
            node = tree.add(act(1.0), job.node)
            done = finish_at[step] is None or i in finish_at[step]
            if done:
                tree.set_reward(node, 1.0)
                results.append(JobResult(job, [node], node, True))
            else:
                end = tree.add(obs(), node)
                results.append(JobResult(job, [node, end], end, False))
        return results

    batches, final = drive(
        step_forks(4, 2, 3, merge_identical=False).plan(PlanContext(tree, random.Random(1), 6)), respond
    )
    assert [len(b) for b in batches] == [4, 3, 3]  # n, then n - n_c with n_c = 1 twice
    assert all(job.max_steps == 1 and job.max_turns == 3 for b in batches for job in b)
    assert len(final.leaves()) == 4 == len(final.info["trajectories"])
    assert sorted(final.info["trajectories"]) == final.leaves()
    for b in batches[1:]:
        for node in {j.node for j in b}:
            assert sum(j.node == node for j in b) <= 2  # at most f continuations of a path
    # every node of the pruned tree lies on a kept trajectory; m(v) is the disjoint union over children
    for v in range(len(final)):
        ids = final.nodes[v].info["traj_ids"]
        kids = final.children(v)
        if kids:
            union = sorted(j for c in kids for j in final.nodes[c].info["traj_ids"])
            assert union == sorted(ids)
    assert final.info["pruned_nodes"] == len(tree) - len(final) > 0


def test_merge_identical_siblings():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(act(1.0), 0)  # a and b: the same step (tokens and observation) -> one node
    oa = tree.add(Segment([7, 8], role="observation"), a)
    b = tree.add(act(1.0), 0)
    ob = tree.add(Segment([7, 8], role="observation"), b)
    c = tree.add(act(1.0), 0)  # the same tokens but another observation -> kept apart
    oc = tree.add(Segment([9], role="observation"), c)
    la = tree.add(Segment([5], role="policy", logprobs=[-1.0]), oa)
    lb = tree.add(Segment([5], role="policy", logprobs=[-1.0]), ob)
    lc = tree.add(Segment([6], role="policy", logprobs=[-1.0]), oc)
    for leaf, r in ((la, 1.0), (lb, 1.0), (lc, 0.0)):
        tree.set_reward(leaf, r)
    merged, mapping = merge_identical_siblings(tree)
    assert mapping[a] == mapping[b] != mapping[c] and mapping[oa] == mapping[ob]
    # identical final steps stay two leaves: each leaf is one trajectory with its own reward
    assert mapping[la] != mapping[lb] and merged.parent(mapping[la]) == merged.parent(mapping[lb])
    assert (
        len(merged) == 8
        and len(merged.leaves()) == 3
        and sorted(merged.rewards().values()) == [0.0, 1.0, 1.0]
    )
    assert merged.nodes[mapping[a]].info["merged_from"] == [a, b]
    for old in (la, lb, lc):
        assert merged.flatten(mapping[old]).token_ids == tree.flatten(old).token_ids


# ------------------------------------------------------------------------------------- on the engine


def engine_for(model, tokenizer, demo, tools, **config):
    config.setdefault("max_segment_tokens", 60)
    config.setdefault("max_episode_tokens", 200)
    return RolloutEngine(HFBackend(model), tokenizer, demo.build_protocol(), tools, EngineConfig(**config))


def check_logprobs(model, trees):
    for tree in trees:
        for leaf in tree.leaves():
            for view in tree.training_views(leaf):
                logprobs, _ = teacher_forced(model, view.token_ids, 1.0, view.policy_mask)
                mask = torch.tensor(view.policy_mask)
                assert (logprobs[mask] - torch.tensor(view.logprobs)[mask]).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["codefence-replace", "tags-asearcher"])
def test_entropy_guided_forks_from_stored_prefixes(trained_tiny, tools, name):
    model, tokenizer = trained_tiny
    demo = DEMO[name]
    reward = lambda item, answer: float(answer == demo.answer)  # noqa: E731
    engine = engine_for(model, tokenizer, demo, tools, seed=2)
    trees = engine.run([demo.question], entropy_guided(2, 4), reward)
    (tree,) = trees
    assert len(tree.leaves()) == 6  # n0 + n leaves (spec 3.6 note (iii))
    assert sum(tree.info["fork_counts"].values()) == 4
    check_logprobs(model, trees)  # caches assembled from stored node blocks are exact
    # without prefix reuse, the same seed gives the same tree but every fork prefills its whole context again
    baseline = engine_for(model, tokenizer, demo, tools, seed=2, reuse_prefix=False)
    (again,) = baseline.run([demo.question], entropy_guided(2, 4), reward, seed=engine._seed)
    assert [n.segment.token_ids for n in again.nodes] == [n.segment.token_ids for n in tree.nodes]
    assert engine.stats.generated_tokens == baseline.stats.generated_tokens
    assert engine.stats.prefill_tokens < baseline.stats.prefill_tokens / 2


@pytest.mark.parametrize("f", [1, 2])
def test_step_forks_keeps_exactly_n_trajectories(trained_tiny, tools, f):
    model, tokenizer = trained_tiny
    demo = DEMO["jsoncall"]
    engine = engine_for(model, tokenizer, demo, tools, seed=4)
    prompts = [demo.question, demo.question + " Now."]
    trees = engine.run(prompts, step_forks(4, f, 3, merge_identical=False), lambda item, a: float(a == "100"))
    for tree in trees:  # spec 9.4 (2)
        assert tree.info["trajectories"] == tree.leaves() and len(tree.leaves()) == 4
        assert len(tree.children(0)) <= 4
        for v in range(1, len(tree)):
            assert len(tree.children(v)) <= f  # f = 1: a chain per trajectory, GRPO-equivalent
            assert sum(tree.segment(n).role == "policy" for n in tree.path(v)) <= 3
        assert all(tree.nodes[leaf].reward is not None for leaf in tree.leaves())
    check_logprobs(model, trees)
    # merging identical sibling steps keeps the n trajectories (leaves); m(v) = the leaves under v
    merged = engine.run(prompts, step_forks(4, f, 3), lambda item, a: float(a == "100"))
    for tree in merged:
        assert tree.info["trajectories"] == tree.leaves() and len(tree.leaves()) == 4
        assert sorted(tree.nodes[0].info["traj_ids"]) == [0, 1, 2, 3]
        for v in range(len(tree)):
            under = tree.leaves_under(v) if v else tree.leaves()
            assert tree.nodes[v].info["traj_ids"] == [tree.info["trajectories"].index(x) for x in under]


def test_step_forks_prefix_reuse_halves_prefill(trained_tiny, tools):
    model, tokenizer = trained_tiny
    demo = DEMO["tags-search-r1"]
    reward = lambda item, a: float(a == "Paris")  # noqa: E731
    shared = engine_for(model, tokenizer, demo, tools, seed=6)
    (tree,) = shared.run([demo.question], step_forks(4, 2, 3, merge_identical=False), reward)
    alone = engine_for(model, tokenizer, demo, tools, seed=6, reuse_prefix=False)
    (again,) = alone.run(
        [demo.question], step_forks(4, 2, 3, merge_identical=False), reward, seed=shared._seed
    )
    assert [n.segment.token_ids for n in again.nodes] == [n.segment.token_ids for n in tree.nodes]
    assert shared.stats.prefill_tokens <= alone.stats.prefill_tokens / 2


def test_independent_plan():
    plan = independent(3).plan(PlanContext(RolloutTree(Segment([1], role="prompt")), random.Random(0), 5))
    assert next(plan) == [Job(0), Job(0), Job(0)]
