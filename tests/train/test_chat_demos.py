"""Chat-format demonstrations: a task file's own ``demo_calls`` (your JSONL, your tools) and the built-in scripts."""

from __future__ import annotations

import pytest

from agentcredit.protocols.native import parse_calls
from agentcredit.tasks import Example
from agentcredit.train.demos import chat_policy, demo_turns


def example(**info):
    return Example("q1", "How many users signed up in May?", ["3"], "jsonl:shop.jsonl", info)


def test_demo_calls_from_the_task_file_are_played_one_message_per_turn():
    calls = [
        {"name": "query", "arguments": {"sql": "SELECT COUNT(*) FROM users"}},
        [{"name": "query", "arguments": {"sql": "A"}}, {"name": "query", "arguments": {"sql": "B"}}],
    ]
    ex = example(demo_calls=calls)
    assert demo_turns(ex) == [
        [("query", {"sql": "SELECT COUNT(*) FROM users"})],
        [("query", {"sql": "A"}), ("query", {"sql": "B"})],
    ]
    for dialect in ("hermes", "llama3", "mistral"):
        first = chat_policy(ex, 0, None, dialect=dialect)
        second = chat_policy(ex, 1, "1", dialect=dialect)
        assert [(c.name, c.arguments) for c in parse_calls(first, dialect).calls] == demo_turns(ex)[0]
        assert [c.arguments["sql"] for c in parse_calls(second, dialect).calls] == ["A", "B"]
        assert chat_policy(ex, 2, "2", dialect=dialect) == "3"  # then the answer
    assert demo_turns(example()) is None


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ("query", "demo_calls must be a list of turns"),
        ([[]], r"demo_calls\[0\] must be a call or a non-empty list"),
        ([{"arguments": {}}], r"demo_calls\[0\]\[0\] must be"),
        ([{"name": "query", "arguments": "SELECT"}], r"demo_calls\[0\]\[0\].arguments must be an object"),
    ],
)
def test_bad_demo_calls_are_named(calls, message):
    with pytest.raises(ValueError, match=f"example 'q1': info.{message}"):
        demo_turns(example(demo_calls=calls))
