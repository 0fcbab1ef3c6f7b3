"""The protocol registry and the shared interface (agentcredit/protocols/__init__.py, base.py, chat.py)."""

from __future__ import annotations

import copy

import pytest
from protocol_helpers import run_episode

from agentcredit.protocols import (
    PROTOCOLS,
    CodeFenceProtocol,
    JsonCallProtocol,
    TagsProtocol,
    get_protocol,
    protocol_options,
)
from agentcredit.protocols.base import Protocol, Turn, check_results
from agentcredit.protocols.chat import CHATML, ChatMarkers
from agentcredit.protocols.native import ChatToolProtocol
from agentcredit.tools.base import ToolCall, ToolResult

SCHEMAS = [{"name": "echo", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}]


def test_names_and_classes():
    assert sorted(PROTOCOLS) == ["chat", "codefence", "jsoncall", "tags"]
    assert isinstance(get_protocol("chat", schemas=SCHEMAS), ChatToolProtocol)
    assert isinstance(get_protocol("codefence"), CodeFenceProtocol)
    assert isinstance(get_protocol("tags", style="qwen-tools"), TagsProtocol)
    assert isinstance(get_protocol("jsoncall", schemas=SCHEMAS), JsonCallProtocol)
    for cls in PROTOCOLS.values():
        assert issubclass(cls, Protocol)


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        get_protocol("codefence", replace=False)
    message = str(err.value)
    assert "'replace'" in message and "replacement" in message and "max_segments" in message
    with pytest.raises(ValueError, match="allowed: .*'style'"):
        get_protocol("tags", styl="qwen-tools")


def test_unknown_protocol():
    with pytest.raises(ValueError, match="choose one of \\['chat', 'codefence', 'jsoncall', 'tags'\\]"):
        get_protocol("react")


def test_protocol_options_lists_defaults():
    assert protocol_options("codefence") == {
        "prompt": "optional",
        "system_prompt": None,
        "replacement": True,
        "tools": None,
        "max_segments": 15,
        "assimilate_tokens": 256,
        "tool_name": "python",
    }
    assert protocol_options("tags")["style"] == "search-r1"
    assert protocol_options("jsoncall")["max_segments"] == 6


def test_bad_option_values_are_value_errors():
    with pytest.raises(ValueError, match="codefence: prompt"):
        get_protocol("codefence", prompt=3)
    with pytest.raises(ValueError, match="tags: chat_markers"):
        get_protocol("tags", style="qwen-tools", chat_markers="chatml")


def test_record_and_result_count_check():
    protocol = get_protocol("codefence")
    state = protocol.new_episode("q?")
    turn = Turn("invoke", calls=[ToolCall("python", {"code": "1"})])
    protocol.record(state, turn, "text")
    assert state.n_turns == 1 and state.texts == ["text"] and state.n_tool_calls == 1 and state.last is turn
    check_results("x", turn, [ToolResult("python", "1")])
    with pytest.raises(
        ValueError, match="x: observation\\(\\) got 0 tool results for a 'invoke' turn with 1 calls"
    ):
        check_results("x", turn, [])


@pytest.mark.parametrize("question", ["", "   ", None, 3])
def test_new_episode_rejects_empty_questions(question):
    with pytest.raises(ValueError, match="non-empty string"):
        get_protocol("tags").new_episode(question)


def test_every_protocol_survives_garbage_output():
    """Malformed output never raises: each protocol returns a turn and, if the episode goes on, an observation."""
    garbage = [
        "",
        "\x00\xff",
        "<<<>>>",
        "```",
        "```python",
        "<tool_call>",
        "}{",
        "<answer>",
        "</context>" * 3,
    ]
    protocols = [
        get_protocol("codefence"),
        get_protocol("tags"),
        get_protocol("tags", style="asearcher"),
        get_protocol("tags", style="qwen-tools"),
        get_protocol("jsoncall", schemas=SCHEMAS),
    ]
    for protocol in protocols:
        for text in garbage:
            for finish in ("stop", "eos", "length"):
                state = protocol.new_episode("q?")
                protocol.segment_ends(state, text)
                turn = protocol.read_segment(state, text, finish)
                protocol.record(state, turn, text)
                if not turn.done:
                    results = [ToolResult(c.name, "") for c in turn.calls]
                    protocol.observation(state, turn, results)


def test_chat_markers_user_turn():
    assert (
        CHATML.user_turn("hi", turn_end_generated=True)
        == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert CHATML.user_turn("hi", turn_end_generated=False).startswith("<|im_end|>\n")
    assert (
        CHATML.ends_turn("x<|im_end|>\n", "length")
        and CHATML.ends_turn("x", "eos")
        and not CHATML.ends_turn("x", "stop")
    )
    llama = ChatMarkers("<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")
    assert (
        llama.user_turn("r", turn_end_generated=False)
        == "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nr<|eot_id|>"
    )


def test_engine_flow_from_the_base_docstring():
    """The flow of agentcredit/protocols/base.py, once, with the plainest protocol and tool."""
    episode = run_episode(
        get_protocol("tags"),
        "capital of France",
        ["<search>capital of France</search>", "<answer>Paris</answer>"],
        {"search": lambda a: "Doc 1 (Title: Paris) Paris is the capital of France."},
    )
    assert episode.kinds == ["search", "answer"]
    assert episode.context_text == (
        "<search>capital of France</search>\n\n<information>Doc 1 (Title: Paris) Paris is the capital of France."
        "</information>\n\n<answer>Paris</answer>"
    )


def test_forked_states_are_independent():
    """A tree rollout forks a state between segments (the engine deep-copies it); each branch evolves on its own."""
    protocol = get_protocol("tags", style="asearcher")
    state = protocol.new_episode("q?")
    text = "<access>https://page</access>"
    turn = protocol.read_segment(state, text, "stop")
    protocol.record(state, turn, text)
    page = "A" * 25_000 + "B" * 25_000 + "C"
    protocol.observation(state, turn, [ToolResult("access", page)])
    branch = copy.deepcopy(state)
    for st in (state, branch):
        read = protocol.read_segment(st, "Page 1.</think>", "stop")
        protocol.record(st, read, "Page 1.</think>")
        obs = protocol.observation(st, read, [])
        assert ">>>> Page 2 >>>>" in obs.text  # both branches read page 2: no shared mutable state
    assert state.n_turns == branch.n_turns == 2 and state.turns is not branch.turns


@pytest.mark.parametrize("name", ["codefence", "tags", "jsoncall"])
def test_render_answer_round_trips_through_extract_answer(name):
    protocol = get_protocol(name)
    for answer in ["Paris", "60450", "New York City"]:
        assert protocol.extract_answer(protocol.render_answer(answer)) == answer
