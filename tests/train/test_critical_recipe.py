"""carl-critical's recipe (issue 31): forks_per_round exposed on both trainers with the paper's sequential default,
the rounds it took logged, and policy/kl_ref recorded though the paper's loss has no KL term."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from train_helpers import EXAMPLES, METHODS, SMALL

from agentcredit.config import load_config
from agentcredit.integrations.verl.settings import load_settings
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.engine import JobResult, PlanContext
from agentcredit.rollout.strategies import entropy_guided, from_rollout_config
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.trainer import Trainer

PIN = Path(__file__).parent / "data" / "pinned_steps.json"


def test_forks_per_round_reaches_the_strategy_on_both_trainers():
    native = load_config("carl-critical-kb-multihop")
    assert native.rollout.forks_per_round == 1  # Algorithm 1: one fork at a time
    assert from_rollout_config(native.rollout).forks_per_round == 1
    fast = load_config("carl-critical-kb-multihop", ["rollout.forks_per_round=4"])
    assert from_rollout_config(fast.rollout).forks_per_round == 4
    verl = load_settings(
        {
            "method": "carl-critical",
            "tree": {"strategy": "entropy_guided", "n0": 1, "n": 16, "forks_per_round": 4},
        }
    )
    assert from_rollout_config(verl.tree).forks_per_round == 4
    with pytest.raises(ValueError, match="forks_per_round"):
        load_settings(
            {"method": "carl-critical", "tree": {"strategy": "entropy_guided", "forks_per_round": 0}}
        )


def _act(h: float) -> Segment:
    return Segment([7], role="policy", kind="search", logprobs=[-h], entropies=[h])


@pytest.mark.parametrize(("k", "rounds"), [(1, 17), (4, 5), (16, 2), (5, 5)])
def test_rounds_are_one_plus_the_fork_rounds(k, rounds):
    """The paper's N0 = 1, N = 16: 17 sequential rounds one fork at a time; ceil(16 / k) + 1 with k per round."""
    tree = RolloutTree(Segment([1], role="prompt"))
    entropies = iter(random.Random(0).uniform(0.1, 2.0) for _ in range(10_000))
    batches = []

    def respond(jobs):
        batches.append(len(jobs))
        out = []
        for job in jobs:
            node, added = job.node, []
            for _ in range(2):  # two actions with an observation between them, then an answer
                node = tree.add(_act(next(entropies)), node)
                added.append(node)
                node = tree.add(Segment([3], role="observation", kind="observation"), node)
                added.append(node)
            node = tree.add(_act(next(entropies)), node)
            added.append(node)
            tree.set_reward(node, 1.0)
            out.append(JobResult(job, added, node, True))
        return out

    plan = entropy_guided(1, 16, forks_per_round=k).plan(PlanContext(tree, random.Random(0), max_turns=10))
    jobs = next(plan)
    try:
        while True:
            jobs = plan.send(respond(jobs))
    except StopIteration:
        pass
    assert tree.info["rounds"] == rounds == len(batches) and sum(batches) == 17
    assert len(tree.leaves()) == 17


def _learn_critical(extra: list[str]) -> dict[str, float]:
    preset, overrides = METHODS["carl-critical"]
    config = load_config(preset, [*SMALL, *overrides, *extra])
    trees = [RolloutTree.from_dict(t) for t in json.loads(PIN.read_text())["carl-critical"]["trees"]]
    for tree in trees:
        tree.info["rounds"] = 8  # as the strategy records it (the stored trees predate the record)
    model, tokenizer = load_base_model("tiny", seed=0)
    by_id = {e.id: e for e in EXAMPLES}
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        return trainer.learn(trees, [by_id[t.prompt_id] for t in trees]).metrics
    finally:
        trainer.close()


def test_kl_ref_is_logged_with_a_zero_kl_coefficient():
    config = load_config("carl-critical-kb-multihop").algorithm
    assert (
        config.kl_coef == 0.0 and config.log_kl_ref
    )  # the paper's loss has no KL; the drift is still logged
    metrics = _learn_critical([])
    assert metrics["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the first step: policy = reference
    assert metrics["loss/kl"] == 0.0  # and the loss carries no KL term
    assert metrics["critical/rounds"] == 8.0
    assert "policy/kl_ref" not in _learn_critical(["algorithm.log_kl_ref=false"])
