"""Credit by step kind (answer / tool call / other) and trajectory outcome: what the trainer logs each step as
``credit/...`` and what ``agentcredit probe-credit`` tabulates per estimator."""

from __future__ import annotations

import math

import pytest
import torch

from agentcredit.config import load_config
from agentcredit.lab.probe import call_minus_answer
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tasks import Example
from agentcredit.train.advantages import compute_advantages
from agentcredit.train.batch import build_batch
from agentcredit.train.metrics import StepCredit, credit_by_step_kind, step_credits
from agentcredit.train.signals import Signals

EXAMPLE = Example("q", "What is 3+4?", ["7"], "arith-tools", {"metric": "numeric"})
CALL = [{"name": "search", "arguments": {"query": "x"}}]


def pol(ids, calls=()):
    seg = Segment(ids, role="policy", kind="step", logprobs=[-1.0] * len(ids), entropies=[1.0] * len(ids))
    seg.info["calls"] = list(calls)
    if calls:
        seg.info["results"] = [{"output": "a passage"} for _ in calls]  # the calls ran
    return seg


def obs(ids):
    return Segment(ids, role="observation", kind="observation")


def end(tree: RolloutTree, leaf: int, answer: str | None, reward: float) -> int:
    tree.nodes[leaf].info["answer"] = answer
    tree.set_reward(leaf, reward)
    return leaf


def three_trajectories() -> tuple[RolloutTree, dict[str, list[int]]]:
    """A searches then answers right; B searches then answers wrong; C writes one step with no call and no
    answer (cut). Returns the tree and each trajectory's policy nodes."""
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    a1 = tree.add(pol([10, 11], CALL), 0)
    a2 = end(tree, tree.add(pol([12]), tree.add(obs([20]), a1)), "7", 1.0)
    b1 = tree.add(pol([13], CALL), 0)
    b2 = end(tree, tree.add(pol([14, 15]), tree.add(obs([21]), b1)), "8", 0.0)
    c1 = end(tree, tree.add(pol([16]), 0), None, 0.0)
    return tree, {"A": [a1, a2], "B": [b1, b2], "C": [c1]}


def test_step_credits_hand_worked():
    tree, nodes = three_trajectories()
    batch = build_batch([tree])
    # advantages per policy token, by node; B's second answer token is outside the loss (counts as 0)
    values = {
        nodes["A"][0]: [1.0, 2.0],
        nodes["A"][1]: [3.0],
        nodes["B"][0]: [-1.0],
        nodes["B"][1]: [-2.0, -4.0],
        nodes["C"][0]: [0.5],
    }
    batch.advantages = torch.zeros_like(batch.advantages)
    batch.loss_mask = batch.policy_mask.clone()
    for row in range(batch.num_rows):
        for node, vals in values.items():
            cols = ((batch.segment_ids[row] == node) & batch.policy_mask[row]).nonzero(as_tuple=True)[0]
            for col, v in zip(cols.tolist(), vals, strict=False):
                batch.advantages[row, col] = v
            if node == nodes["B"][1] and cols.numel():
                batch.loss_mask[row, cols[1]] = False
    credits = step_credits([tree], [EXAMPLE], batch)
    assert sorted(credits, key=lambda c: (c.kind, c.outcome)) == [
        StepCredit(0, "answer", "correct", 3.0),
        StepCredit(0, "answer", "wrong", -1.0),  # (-2 + 0) / 2: the masked token gets no gradient
        StepCredit(0, "call", "correct", 1.5),
        StepCredit(0, "call", "wrong", -1.0),
        StepCredit(0, "other", "unfinished", 0.5),
    ]
    assert credit_by_step_kind(credits) == pytest.approx(
        {
            "credit/answer_step": 1.0,
            "credit/answer_step/correct": 3.0,
            "credit/answer_step/wrong": -1.0,
            "credit/call_step": 0.25,
            "credit/call_step/correct": 1.5,
            "credit/call_step/wrong": -1.0,
            "credit/other_step": 0.5,
            "credit/other_step/unfinished": 0.5,
        }
    )
    # per question: call mean minus answer mean; among failing trajectories B's -1.0 and -1.0
    assert call_minus_answer(credits, ("wrong", "unfinished")) == [0.0]
    assert call_minus_answer(credits, ("correct", "wrong", "unfinished")) == [pytest.approx(0.25 - 1.0)]
    assert call_minus_answer(credits, ("unfinished",)) == []  # C has neither kind


def test_a_step_whose_calls_never_ran_is_not_a_call_step():
    """The engine ends an episode at its own caps (turns, tokens, context) after the step is written: that step
    has calls but no results, so it is `other`, as a protocol's segment cap (which clears the calls) is."""
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    searched = tree.add(obs([20]), tree.add(pol([10], CALL), 0))
    cut = tree.add(pol([11]), searched)
    tree.segment(cut).info["calls"] = CALL  # written, never run
    end(tree, cut, None, 0.0)
    batch = build_batch([tree])
    assert [(c.kind, c.outcome) for c in step_credits([tree], [EXAMPLE], batch)] == [
        ("call", "unfinished"),
        ("other", "unfinished"),
    ]


def all_fail_fork() -> tuple[RolloutTree, int, int]:
    """One search, then a fork: one branch answers wrong at once, the other searches again and answers wrong."""
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    state = tree.add(obs([20]), tree.add(pol([10], CALL), 0))
    quick = end(tree, tree.add(pol([11]), state), "8", -1.0)
    search = tree.add(pol([12], CALL), state)
    end(tree, tree.add(pol([13]), tree.add(obs([21]), search)), "9", -1.0)
    return tree, quick, search


def test_portool_credits_the_searching_branch_over_the_answer_when_all_fail():
    """The probe's mechanism on the smallest tree: every trajectory wrong (R_out = -1), so GRPO gives nothing,
    while PORTool's Eq. 2 decay makes the longer branch's step the better sibling (the paper's decay, see
    tests/credit/test_portool_advantages.py::test_decay_favours_shorter_successes_and_longer_failures)."""
    tree, quick, search = all_fail_fork()
    batch = build_batch([tree])
    for preset in ("grpo-arith-tools", "portool-arith-tools"):
        algo = load_config(preset).algorithm
        adv = compute_advantages(algo, batch, [tree], Signals())
        batch.advantages, batch.loss_mask = adv.advantages, adv.loss_mask
        steps = iter(step_credits([tree], [EXAMPLE], batch))  # trajectory by trajectory, steps in order
        by_node = {node: next(steps).advantage for traj in batch.trajectories for node in traj.policy_nodes}
        if preset.startswith("grpo"):
            assert all(v == 0.0 for v in by_node.values())
        else:
            assert by_node[quick] < 0 < by_node[search]


@pytest.mark.slow
def test_probe_credit_runs_every_estimator_on_the_same_rollouts(fitted_jsoncall):
    from train_helpers import EXAMPLES, SMALL

    from agentcredit.lab.probe import PROBE_ESTIMATORS, format_probe, probe_credit
    from agentcredit.train.rng import PromptSampler

    model, tokenizer = fitted_jsoncall
    config = load_config(
        "portool-arith-tools",
        [
            *SMALL,
            "rollout.n=3",
            "rollout.t_max=3",
            "algorithm.portool.gamma=1.0",
            "algorithm.whiten_advantages=true",
        ],
    )
    result = probe_credit(
        config,
        prompts=3,  # two step-sized batches (rollout.prompts_per_step=2): 2 prompts, then 1
        estimators=list(PROBE_ESTIMATORS),
        log=lambda _m: None,
        model=model,
        tokenizer=tokenizer,
        examples=list(EXAMPLES),
    )
    assert result["prompts"] == 3 and result["rollout"]["episode/count"] == 9
    assert result["method"] == "portool" and result["strategy"] == "step_forks"
    assert set(result["rewards_seen"]) <= {-1.0, 0.0, 1.0}  # PORTool's judge
    # the estimators' settings as they ran: the config's ablation kept, whitening switched off
    assert result["algorithm"]["portool"]["gamma"] == 1.0
    assert result["algorithm"]["whiten_advantages"] is False
    assert result["question_ids"] == [e.id for e in PromptSampler(list(EXAMPLES), config.train.seed).next(3)]
    entries = result["estimators"]
    assert list(entries) == list(PROBE_ESTIMATORS)
    # the same trees for every estimator: the same steps, by kind and outcome
    assert len({tuple(sorted(e["steps"].items())) for e in entries.values()}) == 1
    steps = entries["grpo"]["steps"]
    kinds = [k for k in steps if k.count("/") == 1]
    assert sum(steps[k] for k in kinds) >= 9  # every trajectory has a step
    for kind in kinds:  # a kind's count is the sum of its outcomes'
        assert steps[kind] == sum(v for k, v in steps.items() if k.startswith(kind + "/"))
    for e in entries.values():
        assert all(math.isfinite(v) for v in e["by_kind"].values())
    table = format_probe(result)
    assert table.count("\n") >= 4 and all(name in table for name in PROBE_ESTIMATORS)


def test_probe_credit_names_an_estimator_it_cannot_run():
    from agentcredit.lab.probe import probe_credit

    with pytest.raises(ValueError, match="'gae'.*choose from"):
        probe_credit(load_config("grpo-arith-tools"), prompts=1, estimators=["gae"])
