"""The outcome reward a config names (rewards.task_reward): task.reward first, then carl-critical's format-gated F1,
then the method's judge (an LLM judge is handed its model), else the task's own scoring rule."""

from __future__ import annotations

from functools import partial

import pytest

from agentcredit.config import load_config
from agentcredit.rewards import FormatGatedF1, UserReward, outcome_judge, outcome_reward, task_reward
from agentcredit.tasks import Example

EX = Example("q", "What is the capital of France?", ["Paris"], "t", {"metric": "em"})


def always_one(data_source, solution_str, ground_truth, extra_info) -> float:
    return 1.0


def test_a_method_without_a_judge_scores_with_the_tasks_rule():
    config = load_config("grpo-arith-tools")
    assert outcome_judge(config) is None
    reward = task_reward(config)
    assert isinstance(reward, partial) and reward.func is outcome_reward
    assert reward(EX, "Paris") == 1.0 and reward(EX, "Lyon") == 0.0


def test_portool_scores_with_its_judge_and_an_llm_judge_needs_its_model():
    config = load_config("portool-kb-multihop")
    assert outcome_judge(config).judge == "rule"
    judge = task_reward(config)
    assert (judge(EX, "Paris"), judge(EX, "Lyon"), judge(EX, None)) == (1.0, -1.0, -1.0)
    llm = load_config("portool-kb-multihop", ["algorithm.portool.judge=llm"])
    with pytest.raises(ValueError, match=r"algorithm\.portool\.judge_model"):
        task_reward(llm)  # no model handed over: the same one-line error as a missing judge_model


def test_an_llm_judge_receives_the_model_its_settings_name(monkeypatch):
    import agentcredit.models.embedded as embedded

    loaded = []
    monkeypatch.setattr(embedded, "load_model", lambda name: loaded.append(name) or ("model", "tokenizer"))
    llm = load_config(
        "portool-kb-multihop", ["algorithm.portool.judge=llm", "algorithm.portool.judge_model=/models/judge"]
    )
    judge = task_reward(llm)
    assert loaded == ["/models/judge"] and (judge.model, judge.tokenizer) == ("model", "tokenizer")
    assert task_reward(llm, ("mine", "tok")).model == "mine" and loaded == [
        "/models/judge"
    ]  # given: not loaded


def test_task_reward_and_the_format_gate_come_before_the_judge():
    mine = load_config("portool-kb-multihop", [f"task.reward={__name__}:always_one"])
    assert outcome_judge(mine) is None and isinstance(task_reward(mine), UserReward)
    gated = load_config("grpo-arith-tools", ["task.metric=set_f1_format"])
    assert outcome_judge(gated) is None and isinstance(task_reward(gated), FormatGatedF1)
