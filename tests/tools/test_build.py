"""The schemas a protocol shows (tools.build.shown_schemas): a per-episode environment's, jsoncall's subset plus
your functions, chat's (which must show a tool unless each question brings its own), or the protocol's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentcredit.tools.build import shown_schemas


def names(schemas):
    return sorted(s["function"]["name"] for s in schemas)


def settings(suite_tools=None):
    return SimpleNamespace(suite_tools=suite_tools)


def test_a_protocol_without_tool_schemas_keeps_its_own():
    assert shown_schemas(settings(), "codefence") is None
    assert shown_schemas(settings(), "jsoncall") is None  # the whole suite, the protocol's default


def test_jsoncall_shows_the_named_suite_tools_and_always_response_gen():
    mine = SimpleNamespace(schema={"type": "function", "function": {"name": "mine"}})
    assert names(shown_schemas(settings(["math_calculation"]), "jsoncall")) == [
        "math_calculation",
        "response_gen",
    ]
    assert "mine" in names(shown_schemas(settings(), "jsoncall", functions=[mine]))
    with pytest.raises(ValueError, match="unknown tool"):
        shown_schemas(settings(["no_such_tool"]), "jsoncall")


def test_chat_never_shows_response_gen_and_needs_a_tool_unless_questions_bring_their_own():
    assert names(shown_schemas(settings(["math_calculation", "response_gen"]), "chat")) == [
        "math_calculation"
    ]
    with pytest.raises(ValueError, match="shows the model no tools"):
        shown_schemas(settings(), "chat")
    assert shown_schemas(settings(), "chat", per_question_tools=True) == []


def test_a_per_episode_environment_shows_its_own_tools_and_jsoncall_adds_response_gen():
    episodes = SimpleNamespace(schemas=[{"type": "function", "function": {"name": "query"}}])
    assert names(shown_schemas(settings(), "chat", episodes)) == ["query"]
    assert names(shown_schemas(settings(), "jsoncall", episodes)) == ["query", "response_gen"]
