"""entropy_guided honours T_max, carl-critical's action cap (issue 11 item 2).

carl-critical-actions.md 2.1: an episode ends at an answer or after T_max actions (the paper: 10 for the 4B runs,
32 otherwise); ``methods/carl-critical.yaml`` sets ``rollout.t_max: 10``. Before the fix the strategy took no t_max
at all and every episode (and fork) ran to the engine's turn cap.
"""

from __future__ import annotations

import random

import pytest
from rollout_helpers import DEMOS

from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, JobResult, PlanContext, RolloutEngine
from agentcredit.rollout.strategies import action_depth, entropy_guided
from agentcredit.rollout.tree import RolloutTree, Segment

DEMO = {demo.name: demo for demo in DEMOS}


def act(h: float) -> Segment:
    return Segment([5, 6], role="policy", kind="step", logprobs=[-h, -h])


def obs() -> Segment:
    return Segment([7], role="observation", kind="observation")


def drive(plan, respond):
    batches = []
    jobs = next(plan)
    while True:
        batches.append(jobs)
        try:
            jobs = plan.send(respond(jobs))
        except StopIteration as stop:
            return batches, stop.value


def run_by_hand(strategy, max_turns: int):
    """Each job acts (action + observation) until the job's turn cap, as the engine does; returns the tree and
    the job lists. The action entropies grow with depth, so without a cap the deepest state would be forked."""
    tree = RolloutTree(Segment([1], role="prompt"))

    def respond(jobs):
        results = []
        for job in jobs:
            cap = min(max_turns, job.max_turns or max_turns)
            node, added = job.node, []
            while action_depth(tree, node) < cap:
                depth = action_depth(tree, node)
                node = tree.add(act(0.5 + depth), node)
                added.append(node)
                if action_depth(tree, node) < cap:
                    node = tree.add(obs(), node)
                    added.append(node)
            results.append(JobResult(job, added, node, True))
        return results

    batches, final = drive(strategy.plan(PlanContext(tree, random.Random(0), max_turns)), respond)
    assert final is None
    return tree, batches


def test_t_max_caps_every_episode_and_every_fork():
    tree, batches = run_by_hand(entropy_guided(1, 3, t_max=2), max_turns=10)
    jobs = [job for batch in batches for job in batch]
    assert len(jobs) == 4 and all(job.max_turns == 2 for job in jobs)
    assert all(action_depth(tree, leaf) == 2 for leaf in tree.leaves())
    # the only states that can still act at depth < 2: the root and the state after the first action
    assert {job.node for job in jobs[1:]} <= {0, 2}
    assert tree.info["t_max"] == 2


def test_t_max_above_the_engine_cap_and_none_give_the_engine_cap():
    for strategy in (entropy_guided(1, 2, t_max=8), entropy_guided(1, 2)):
        tree, batches = run_by_hand(strategy, max_turns=3)
        assert all(job.max_turns == 3 for batch in batches for job in batch)
        assert tree.info["t_max"] == 3


def test_t_max_is_validated():
    with pytest.raises(ValueError, match="t_max must be >= 1"):
        entropy_guided(1, 2, t_max=0)


def test_t_max_on_the_engine(trained_tiny, tools):
    """The fitted tiny model answers the codefence demo in three segments; with T_max = 1 every root-to-leaf
    path, forks included, stops after one action."""
    model, tokenizer = trained_tiny
    demo = DEMO["codefence-keep"]
    engine = RolloutEngine(
        HFBackend(model),
        tokenizer,
        demo.build_protocol(),
        tools,
        EngineConfig(max_segment_tokens=60, max_episode_tokens=200, seed=2),
    )
    reward = lambda item, answer: float(answer == demo.answer)  # noqa: E731
    (tree,) = engine.run([demo.question], entropy_guided(1, 3, t_max=1), reward)
    assert len(tree.leaves()) == 4
    assert all(action_depth(tree, leaf) == 1 for leaf in tree.leaves())
    assert tree.info["fork_counts"] == {"0": 3}  # only the root can act
    (deep,) = engine.run([demo.question], entropy_guided(1, 0, t_max=3), reward)
    assert action_depth(deep, deep.leaves()[0]) > 1  # without the cap the demo episode takes several actions
