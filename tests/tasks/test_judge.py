import pytest

from agentcredit.tasks import Example
from agentcredit.tasks.judge import LLMJudge, build_judge, parse_label, rule_judge

EX = Example("q", "What is the capital of France?", ["Paris"], "t", {"metric": "em"})


def test_rule_judge_labels():
    assert rule_judge(EX, "Paris") == 1.0
    assert rule_judge(EX, "Lyon") == -1.0
    assert rule_judge(EX, "I am unable to find this information.") == 0.0
    assert rule_judge(EX, None) == -1.0  # unfinished
    num = Example("n", "2+2?", ["4"], "arith-tools", {"metric": "numeric"})
    assert rule_judge(num, "4.0") == 1.0


@pytest.mark.parametrize(
    "reply, label",
    [
        ('{"label": "true", "rationale": "matches"}', "true"),
        ('Sure. {"label": "unable_to_answer", "rationale": "x"} done', "unable_to_answer"),
        ("The answer is false because ...", "false"),
        ("no idea", None),
    ],
)
def test_parse_label(reply, label):
    assert parse_label(reply) == label


def test_build_judge_needs_a_model_for_llm():
    with pytest.raises(ValueError, match="judge_model"):
        build_judge("llm")
    assert build_judge("rule")(EX, "Paris") == 1.0


@pytest.mark.slow
def test_llm_judge_runs_on_the_embedded_model():
    from agentcredit.models.embedded import load_model

    judge = LLMJudge(*load_model("embedded"), max_new_tokens=24)
    reward = judge(EX, "Paris")
    assert reward in (1.0, 0.0, -1.0)
    assert judge(EX, None) == -1.0
