"""PORTool's JSON tool-call protocol and its formatting reward (portool.md sections 2 and 3.2)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import SEEDS, SPECS, run_episode, stops_at, token_pieces

from agentcredit.protocols import get_protocol
from agentcredit.protocols.jsoncall import (
    FORMAT_ERROR,
    JSONCALL_SYSTEM_PROMPT_TEMPLATE,
    RESPONSE_GEN_SCHEMA,
    JsonCallProtocol,
    StepFormat,
    format_reward_raw,
    rescale_format_reward,
)
from agentcredit.tools.base import ToolResult

# A small local tool list: two of the paper's schemas (App. D) in the two accepted shapes.
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "math_calculation",
            "description": "Performs mathematical calculations using function-call syntax.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "Mathematical expression."}},
                "required": ["expression"],
            },
        },
    },
    {
        "name": "get_current_context",
        "description": "Retrieves the user's current location and/or current time.",
        "parameters": {
            "type": "object",
            "properties": {
                "requested_context": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["current_location", "current_time"]},
                }
            },
            "required": ["requested_context"],
        },
    },
]
TOOLS = {
    "math_calculation": lambda a: (
        "16" if a["expression"] == "add(9, 7)" else "ERROR: cannot parse expression"
    ),
    "get_current_context": lambda a: '{"current_time": {"date_time": "Saturday 2025-09-27T02:47:20-07:00"}}',
}
QUERY = "if you're nine years old, how old will you be in seven years"


def step(think: str | None, calls) -> str:
    body = calls if isinstance(calls, str) else json.dumps(calls)
    head = f"<think> {think} </think>\n" if think is not None else ""
    return f"{head}<tool_call>\n{body}\n</tool_call>"


def protocol(**options) -> JsonCallProtocol:
    return get_protocol("jsoncall", schemas=SCHEMAS, **options)


# ---------------------------------------------------------------------------------------------- prompt
def _spec_prompt() -> str:
    text = (SPECS / "portool.md").read_text()
    section = text[text.index("### 2.4 System prompt") : text.index("### 2.5")]
    return re.search(r"```\n(.*?)\n```", section, re.S).group(1)


def test_system_prompt_is_verbatim_from_the_spec():
    assert _spec_prompt() == JSONCALL_SYSTEM_PROMPT_TEMPLATE


@pytest.mark.skipif(not SEEDS.exists(), reason="needs ../shared/seeds")
def test_system_prompt_agrees_with_the_paper_up_to_typesetting():
    """The paper's PDF text has curly quotes, OCR-split words and a garbled example line where the spec (and
    we) have ASCII text; outside the garbled example both say the same thing word for word."""
    paper = (SEEDS / "portool.txt").read_text()
    start = paper.index("You are a helpful dialogue assistant")
    end = paper.index("do not invoke response_ gen until the task is completed.") + len(
        "do not invoke response_ gen until the task is completed."
    )

    def norm(text: str) -> str:
        text = text.replace("’", "'").replace("“", '"').replace("”", '"')
        text = text.replace("response_ gen", "response_gen").replace("{tool_ json}", "{tool_json}")
        return " ".join(text.split())

    ours, theirs = norm(JSONCALL_SYSTEM_PROMPT_TEMPLATE), norm(paper[start:end])
    head, tail = "Output Format:", "Important Notes:"
    assert ours.split(head)[0] == theirs.split(head)[0]
    assert ours.split(tail)[1] == theirs.split(tail)[1]


def test_prompt_lists_the_tools_and_response_gen(smollm2_tokenizer):
    p = protocol()
    state = p.new_episode(QUERY)
    system = p.messages(state)[0]["content"]
    assert p.tool_names == ["math_calculation", "get_current_context", "response_gen"]
    tool_json = system.split("Available tools:\n")[1].split("\n\nOutput Format:")[0]
    listed = json.loads(tool_json)
    assert [t["function"]["name"] for t in listed] == p.tool_names
    assert listed[-1] == RESPONSE_GEN_SCHEMA
    assert "{tool_json}" not in system
    text = p.prompt(state, smollm2_tokenizer)
    assert text.endswith(f"<|im_start|>user\n{QUERY}<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------- cascade
def test_format_cascade_hand_worked_values():
    """portool.md 9.4 item 7."""
    assert format_reward_raw(StepFormat()) == 0.0  # no think
    assert (
        format_reward_raw(
            StepFormat(has_tool_call=True, json_ok=True, fields_ok=True, n_calls=1, n_success=1)
        )
        == 0.0
    )
    assert format_reward_raw(StepFormat(has_think=True)) == pytest.approx(0.2)
    assert format_reward_raw(StepFormat(True, True)) == pytest.approx(0.3)  # tags but bad JSON
    assert format_reward_raw(StepFormat(True, True, True, fields_ok=False, n_calls=2)) == pytest.approx(0.4)
    assert format_reward_raw(StepFormat(True, True, True, True, n_calls=2, n_success=1)) == pytest.approx(
        0.725
    )
    assert format_reward_raw(StepFormat(True, True, True, True, n_calls=3, n_success=3)) == 1.0
    assert format_reward_raw(StepFormat(True, True, True, True, n_calls=0)) == pytest.approx(
        0.4
    )  # empty list


def test_rescaling_hand_worked_values():
    assert rescale_format_reward(0.0) == -0.25
    assert rescale_format_reward(1.0) == 0.25
    assert rescale_format_reward(0.725) == pytest.approx(0.1125)  # 0.5 * 0.725 - 0.25
    assert rescale_format_reward(0.5, bound=0.1) == 0.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rescale_format_reward(1.5)
    with pytest.raises(ValueError, match="n_success"):
        StepFormat(True, True, True, True, n_calls=1, n_success=2)


@given(
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    n_calls=st.integers(0, 8),
    data=st.data(),
)
def test_cascade_range_and_monotonicity(flags, n_calls, data):
    n_success = data.draw(st.integers(0, n_calls))
    fmt = StepFormat(*flags, n_calls=n_calls, n_success=n_success)
    raw = format_reward_raw(fmt)
    assert 0.0 <= raw <= 1.0
    assert -0.25 <= rescale_format_reward(raw) <= 0.25
    if n_success < n_calls:  # one more successful call never lowers the reward
        better = StepFormat(*flags, n_calls=n_calls, n_success=n_success + 1)
        assert format_reward_raw(better) >= raw
    if not fmt.has_think:
        assert raw == 0.0


# ---------------------------------------------------------------------------------------------- episodes
def test_parallel_calls_then_response_gen():
    p = protocol()
    outputs = [
        step(
            "I need the current time and the sum.",
            [
                {"name": "get_current_context", "arguments": {"requested_context": ["current_time"]}},
                {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}},
            ],
        ),
        step("I can answer now.", [{"name": "response_gen", "arguments": {"response": "You will be 16."}}]),
    ]
    episode = run_episode(p, QUERY, outputs, TOOLS)
    first, last = episode.segments
    assert first.finish == "eos" and first.turn.kind == "step" and len(first.turn.calls) == 2
    assert first.turn.info["format_reward_raw"] == 1.0 and first.turn.info["format_reward"] == 0.25
    # One observation for the step, one {"name", "response"} line per call in order, in a user turn.
    assert first.observation.text == (
        "\n<|im_start|>user\n<response>\n"
        + json.dumps({"name": "get_current_context", "response": TOOLS["get_current_context"]({})})
        + "\n"
        + json.dumps({"name": "math_calculation", "response": "16"})
        + "\n</response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        last.turn.done and last.turn.answer == "You will be 16." and last.turn.info["format_reward"] == 0.25
    )
    assert [c["name"] for c in episode.calls_run] == ["get_current_context", "math_calculation"]


def test_missing_think_or_tool_call_gets_the_papers_error_and_runs_nothing():
    p = protocol()
    no_think = step(None, [{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}}])
    no_open_tag = '<think> use math </think>\n[{"name": "math_calculation", "arguments": {"expression": "1"}}]</tool_call>'
    answer = step("done", [{"name": "response_gen", "arguments": {"response": "16"}}])
    episode = run_episode(p, QUERY, [no_think, no_open_tag, answer], TOOLS)
    assert episode.calls_run == []
    for record, raw in zip(episode.segments[:2], (0.0, 0.2), strict=True):
        assert record.turn.info["error"] == FORMAT_ERROR and record.turn.calls == []
        assert record.observation.text == (
            f"\n<|im_start|>user\n<response>\n{FORMAT_ERROR}\n</response><|im_end|>\n<|im_start|>assistant\n"
        )
        assert record.turn.info["format_reward_raw"] == pytest.approx(raw)
    assert episode.segments[0].turn.info["format_reward"] == -0.25
    assert FORMAT_ERROR == (
        "ERROR: Invalid output format. A valid output must include both: (i) the <think>...</think> field; "
        "and (ii) the <tool_call>...</tool_call> field."
    )
    assert episode.segments[-1].turn.answer == "16"


def test_tool_call_before_think_is_a_format_error():
    p = protocol()
    text = '<tool_call>[{"name": "math_calculation", "arguments": {"expression": "1"}}]</tool_call><think> x </think>'
    turn = p.read_segment(p.new_episode(QUERY), text, "eos")
    assert turn.info["error"] == FORMAT_ERROR and turn.info["format_reward_raw"] == pytest.approx(0.2)


def test_malformed_json_gets_an_error_observation():
    p = protocol()
    bad = step("compute", '[{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}')
    episode = run_episode(
        p, QUERY, [bad, step("x", [{"name": "response_gen", "arguments": {"response": "16"}}])], TOOLS
    )
    turn = episode.segments[0].turn
    assert turn.info["format_reward_raw"] == pytest.approx(0.3) and turn.calls == []
    assert "not valid JSON" in turn.info["error"] and "at line 3 column 1" in turn.info["error"]
    assert turn.info["error"] in episode.segments[0].observation.text


def test_schema_errors_unknown_tools_and_missing_fields():
    p = protocol()
    calls = [
        {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}},  # valid
        {"name": "math_calculation", "arguments": {"expr": "1"}},  # missing required field
        {"name": "get_current_context", "arguments": {"requested_context": ["weather"]}},  # enum violation
        {"name": "weather_search", "arguments": {"location": "Cupertino"}},  # unknown tool
    ]
    episode = run_episode(
        p,
        QUERY,
        [step("try", calls), step("x", [{"name": "response_gen", "arguments": {"response": "16"}}])],
        TOOLS,
    )
    record = episode.segments[0]
    assert [c.name for c in record.turn.calls] == ["math_calculation"]  # only the valid call runs
    lines = [
        json.loads(x)
        for x in record.observation.text.split("<response>\n")[1].split("\n</response>")[0].split("\n")
    ]
    assert lines[0] == {"name": "math_calculation", "response": "16"}
    assert "'expression' is a required property" in lines[1]["response"]
    assert lines[2]["response"].startswith(
        "ERROR: Invalid arguments for get_current_context at $.requested_context[0]"
    )
    assert lines[3]["response"].startswith(
        "ERROR: Unknown tool 'weather_search'. Available tools: math_calculation"
    )
    # fields ok, 1 of 4 calls succeeded: 0.45 + 0.55 / 4
    assert record.turn.info["format_reward_raw"] == pytest.approx(0.45 + 0.55 / 4)

    missing_arguments = [
        {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}},
        {"name": "math_calculation"},
    ]
    turn = p.read_segment(p.new_episode(QUERY), step("x", missing_arguments), "eos")
    assert turn.info["format_reward_raw"] == pytest.approx(0.4)  # JSON ok, a call lacks "arguments"
    assert len(turn.calls) == 1 and "must be a JSON object" in turn.info["slots"][1]["error"]


def test_tool_side_errors_lower_the_format_reward():
    """Spec 3.2 [R]: a tool-side ERROR result is a failed call; the reward is completed in observation()."""
    p = protocol()
    calls = [
        {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}},
        {"name": "math_calculation", "arguments": {"expression": "add(9, seven)"}},
    ]
    episode = run_episode(
        p,
        QUERY,
        [step("sum", calls), step("x", [{"name": "response_gen", "arguments": {"response": "16"}}])],
        TOOLS,
    )
    info = episode.segments[0].turn.info
    assert [r.ok for r in episode.segments[0].results] == [True, False]
    assert info["format"]["n_success"] == 1 and info["format_reward_raw"] == pytest.approx(0.725)
    assert info["format_reward"] == pytest.approx(0.1125)


def test_response_gen_mixed_with_other_calls_ends_the_episode():
    """Spec 8.15: complete; the other calls are not run and count as failed."""
    p = protocol()
    calls = [
        {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}},
        {"name": "response_gen", "arguments": {"response": 'You will be {16}: {"age": {"years": 16}}'}},
    ]
    episode = run_episode(p, QUERY, [step("both", calls)], TOOLS)
    turn = episode.segments[0].turn
    assert turn.done and turn.calls == [] and episode.calls_run == []
    assert turn.answer == 'You will be {16}: {"age": {"years": 16}}'  # nested braces survive (JSON parse)
    assert turn.info["format_reward_raw"] == pytest.approx(0.45 + 0.55 / 2)


def test_response_gen_without_a_response_string():
    p = protocol()
    turn = p.read_segment(
        p.new_episode(QUERY), step("x", [{"name": "response_gen", "arguments": {"query": "q"}}]), "eos"
    )
    assert turn.done and turn.answer is None and "required property" in turn.info["error"]
    assert turn.info["format_reward_raw"] == pytest.approx(0.45)


def test_step_cap_ends_the_episode_without_an_answer():
    p = protocol()
    calls = [{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}}]
    episode = run_episode(p, QUERY, [step("again", calls)] * 10, TOOLS)
    assert len(episode.segments) == 6 and len(episode.calls_run) == 5
    last = episode.segments[-1].turn
    assert last.done and last.answer is None and last.info["cut"] == "max_segments" and last.calls == []
    assert last.info["format_reward_raw"] == 1.0  # no tool result: schema validity alone


def test_single_object_is_wrapped_unless_strict():
    one = step("x", {"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}})
    lenient = protocol().read_segment(protocol().new_episode(QUERY), one, "eos")
    assert len(lenient.calls) == 1 and lenient.info["format_reward_raw"] == 1.0
    strict = protocol(strict_list=True).read_segment(protocol().new_episode(QUERY), one, "eos")
    assert strict.calls == [] and "JSON array" in strict.info["error"]
    assert strict.info["format_reward_raw"] == pytest.approx(0.4)
    empty = protocol().read_segment(protocol().new_episode(QUERY), step("x", []), "eos")
    assert "empty JSON array" in empty.info["error"] and empty.info["format_reward_raw"] == pytest.approx(0.4)


def test_stop_at_tool_call_and_the_end_of_turn_token():
    p = protocol(stop_at_tool_call=True)
    text = step("x", [{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}}])
    episode = run_episode(
        p,
        QUERY,
        [text + "\nI will now wait.", step("y", [{"name": "response_gen", "arguments": {"response": "16"}}])],
        TOOLS,
    )
    first = episode.segments[0]
    assert first.finish == "stop" and stops_at(first.text, "</tool_call>")
    # The model did not emit its end-of-turn token, so the environment writes it (not trained).
    assert first.observation.text.startswith("<|im_end|>\n<|im_start|>user\n<response>\n")
    assert protocol().stop_strings(p.new_episode(QUERY)) == ["<|im_end|>"]


def test_with_real_tokens(smollm2_tokenizer):
    pieces = token_pieces(smollm2_tokenizer)
    outputs = [
        step("sum", [{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}}]),
        step("done", [{"name": "response_gen", "arguments": {"response": "16"}}]),
    ]
    episode = run_episode(protocol(), QUERY, outputs, TOOLS, pieces=pieces)
    assert episode.kinds == ["step", "step"] and episode.segments[-1].turn.answer == "16"
    assert protocol().extract_answer(outputs[1]) == "16" and protocol().extract_answer("nothing") is None


def test_observation_result_count_must_match():
    p = protocol()
    state = p.new_episode(QUERY)
    text = step("x", [{"name": "math_calculation", "arguments": {"expression": "add(9, 7)"}}])
    turn = p.read_segment(state, text, "eos")
    p.record(state, turn, text)
    with pytest.raises(ValueError, match="1 calls"):
        p.observation(state, turn, [ToolResult("a", "1"), ToolResult("b", "2")])


def test_invalid_schemas_and_options():
    with pytest.raises(ValueError, match="schema 0 has no 'name'"):
        JsonCallProtocol(schemas=[{"description": "nameless"}])
    with pytest.raises(ValueError, match="invalid 'parameters'"):
        JsonCallProtocol(schemas=[{"name": "t", "parameters": {"type": "no-such-type"}}])
    with pytest.raises(ValueError, match="duplicate tool names"):
        JsonCallProtocol(schemas=[SCHEMAS[0], SCHEMAS[0]])
    with pytest.raises(ValueError, match="list of tool schemas"):
        JsonCallProtocol(schemas=SCHEMAS[1])
    with pytest.raises(ValueError, match="max_segments"):
        JsonCallProtocol(schemas=SCHEMAS, max_segments=0)


def test_default_schemas_come_from_the_tool_suite():
    try:
        from agentcredit.tools.suite import suite_schemas
    except ImportError:
        with pytest.raises(ValueError, match="pass schemas="):
            JsonCallProtocol()
        return
    p = JsonCallProtocol()
    assert len(p.tool_names) >= len(suite_schemas())
    assert "response_gen" in p.tool_names


def test_segment_ends_is_cheap_per_token():
    import time

    p = protocol(stop_at_tool_call=True)
    state = p.new_episode(QUERY)

    def per_call(text, n=2000):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                p.segment_ends(state, text)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    long = "<think>" + "reasoning " * 20_000
    assert per_call(long) < 20e-6 and per_call(long) < 10 * per_call("<think>") + 5e-6
