"""carl-critical's training reward (carl-critical-actions.txt l. 513: "a format reward with an F1-based answer
reward"): set-F1 times 1[every action passes ASearcher's format check], wired as ``task.metric: set_f1_format``
and scored on the episode's actions by the engine's ``episode_reward``."""

from __future__ import annotations

import pytest

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.rewards import FormatGatedF1
from agentcredit.rollout.engine import episode_reward
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tasks import Example
from agentcredit.tasks.scoring import format_gated_f1

GOOD = [
    "<think>Find the band.</think>\n<search>Hey Jude</search>",
    "<think>Done.</think>\n<answer>The Beatles</answer>",
]


def test_format_gated_f1_by_hand():
    # set-F1("The Beatles", "Beatles"): precision 1/2, recall 1 -> 2/3; one malformed action gates it to 0
    assert format_gated_f1("The Beatles", ["Beatles"], GOOD) == pytest.approx(2 / 3)
    two_tags = "<search>a</search><search>b</search>"
    assert format_gated_f1("The Beatles", ["Beatles"], [two_tags, GOOD[1]]) == 0.0
    assert format_gated_f1("The Beatles", ["Beatles"], ["Assistant: <answer>x</answer>"]) == 0.0
    assert format_gated_f1(None, ["Beatles"], GOOD) == 0.0


def _episode(actions: list[str]) -> tuple[RolloutTree, int]:
    tree = RolloutTree(Segment([1], "prompt", role="prompt", kind="prompt"))
    node = tree.add(Segment([2], actions[0]), 0)
    node = tree.add(
        Segment([3], "<information>Hey Jude: a Beatles song</information>", role="observation"), node
    )
    node = tree.add(Segment([4], actions[1]), node)
    return tree, node


def test_the_engine_scores_the_episodes_actions():
    example = Example(id="q", question="Who sang Hey Jude?", answers=["Beatles"], task="kb-multihop")
    reward = FormatGatedF1()
    tree, leaf = _episode(GOOD)
    assert episode_reward(reward, example, "The Beatles", tree, leaf) == pytest.approx(2 / 3)
    # the observation's tags are not an action's: only policy segments are checked
    bad, leaf = _episode(["<search>a</search><answer>b</answer>", GOOD[1]])
    assert episode_reward(reward, example, "The Beatles", bad, leaf) == 0.0
    with pytest.raises(ValueError, match="set_f1_format scores an episode's actions"):
        reward(example, "The Beatles")


def test_the_qa_presets_train_on_the_papers_reward():
    for preset in ("carl-critical-kb-multihop", "carl-critical-hotpotqa"):
        assert load_config(preset).task.metric == "set_f1_format"
    config = load_config("carl-critical-kb-multihop")
    env = build_environment(config)
    try:
        assert isinstance(env.reward, FormatGatedF1)
    finally:
        env.close()
    # the numeric presets keep their task's match (a labelled deviation)
    assert load_config("carl-critical-arith-tools").task.metric == "auto"


def test_a_judge_method_refuses_the_format_gated_reward():
    config = load_config("portool-kb-multihop", ["task.metric=set_f1_format"])
    with pytest.raises(ValueError, match="set_f1_format: this method scores outcomes with its judge"):
        build_environment(config)
