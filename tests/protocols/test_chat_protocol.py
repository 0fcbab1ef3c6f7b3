"""The ``chat`` protocol: the model's own tool-call format, read off its chat template (issue 15).

Three template families, with tokenizer files made here (the SmolLM2 tokenizer with added special tokens and a
template written in the family's format; no download): Qwen/Hermes (``<tool_call>`` blocks, tool results in a
user turn), Llama 3 (a JSON call message, ``ipython`` turns with JSON-quoted content), and SmolLM2's own template,
which shows no tools (they go in a Hermes-format system message). The central check: what the protocol appends
token by token equals what the template renders for the same conversation, so training sees the text the model
would see at inference.
"""

from __future__ import annotations

import json

import pytest
from protocol_helpers import run_episode, token_pieces

from agentcredit.protocols import get_protocol
from agentcredit.protocols.chat import ToolTurns
from agentcredit.protocols.native import ChatToolProtocol, detect_dialect, parse_calls
from agentcredit.tools.base import ToolResult

QUERY = {
    "type": "function",
    "function": {
        "name": "query",
        "description": "Run one SQL query.",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
    },
}

# Qwen/Hermes family, written here in that format (tools in the system turn, <tool_call> blocks, results as
# <tool_response> blocks in one user turn).
QWEN_STYLE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + '\n\n' }}{% endif %}"
    "{{ 'Tools:\n<tools>' }}{% for t in tools %}{{ '\n' + (t | tojson) }}{% endfor %}"
    """{{ '\n</tools>\nCall one as <tool_call>\n{"name": <name>, "arguments": <arguments>}\n</tool_call><|im_end|>\n' }}"""
    "{% elif messages[0].role == 'system' %}{{ '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\n' + m.content }}"
    "{% for c in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\n' }}{% endif %}"
    """{{ '<tool_call>\n{"name": "' + c.function.name + '", "arguments": ' + (c.function.arguments | tojson) }}"""
    "{{ '}\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or loop.previtem.role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{% if loop.last or loop.nextitem.role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% elif m.role != 'system' %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama 3 family (JSON tool calling): header-id turns, the call as a JSON message with "parameters", tool results
# in ipython turns, written with tojson.
LLAMA3_STYLE = (
    "{% for m in messages %}"
    "{% set role = 'ipython' if m.role == 'tool' else m.role %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' }}"
    "{% if m.role == 'user' and tools %}{{ 'Tools:\n' }}{% for t in tools %}{{ (t | tojson) + '\n' }}{% endfor %}"
    "{{ 'Call one as a JSON object with its name and parameters.\n\n' }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    """{{ '{"name": "' + c.function.name + '", "parameters": ' + (c.function.arguments | tojson) + '}' }}"""
    "{% endfor %}{% elif m.role == 'tool' %}{{ m.content | tojson }}{% else %}{{ m.content }}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


def family_tokenizer(base, tmp_path_factory, name: str):
    """``base`` saved with the family's template (and special tokens), reloaded from disk as a user would."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(name)
    base.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if name == "qwen":
        tokenizer.chat_template = QWEN_STYLE
    else:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": LLAMA3_SPECIALS, "eos_token": "<|eot_id|>"}
        )
        tokenizer.chat_template = LLAMA3_STYLE
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def qwen(smollm2_tokenizer, tmp_path_factory):
    return family_tokenizer(smollm2_tokenizer, tmp_path_factory, "qwen")


@pytest.fixture(scope="module")
def llama(smollm2_tokenizer, tmp_path_factory):
    return family_tokenizer(smollm2_tokenizer, tmp_path_factory, "llama")


def sql(arguments):
    return {"SELECT COUNT(*) FROM users": "3"}.get(arguments["sql"], "ERROR: no such table")


# ------------------------------------------------------------------------------------------- template reading
def test_tool_turns_read_off_each_family(qwen, llama, smollm2_tokenizer):
    assert ToolTurns.from_tokenizer(qwen) == ToolTurns(
        turn_end="<|im_end|>",
        open="\n<|im_start|>user\n<tool_response>\n",
        separator="\n</tool_response>\n<tool_response>\n",
        close="\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    assert ToolTurns.from_tokenizer(llama) == ToolTurns(
        turn_end="<|eot_id|>",
        open="<|start_header_id|>ipython<|end_header_id|>\n\n",
        separator="<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n",
        close="<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        json_quoted=True,
    )
    # SmolLM2 renders any role as a ChatML turn, so a tool role becomes "<|im_start|>tool"
    assert ToolTurns.from_tokenizer(smollm2_tokenizer).open == "\n<|im_start|>tool\n"

    class NoTools:
        def apply_chat_template(self, *args, **kwargs):
            raise ValueError("Conversation roles must alternate")

    with pytest.raises(ValueError, match="tool_turns=ToolTurns"):
        ToolTurns.from_tokenizer(NoTools())


def test_dialects_detected_from_the_template_source(qwen, llama, smollm2_tokenizer):
    assert detect_dialect(qwen.chat_template) == "hermes"
    assert detect_dialect(llama.chat_template) == "llama3"
    assert detect_dialect("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_dialect(smollm2_tokenizer.chat_template) is None


# -------------------------------------------------------- appending equals rendering (the central property)
@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_appended_episode_equals_the_templates_rendering(family, request):
    """prompt + the model's call + the tool turn + the answer == the template's rendering of that conversation."""
    tokenizer = request.getfixturevalue(family)
    protocol = get_protocol("chat", schemas=[QUERY], system_prompt="You answer from the database.")
    arguments = {"sql": "SELECT COUNT(*) FROM users"}
    if family == "qwen":
        call_text = f'<tool_call>\n{{"name": "query", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    else:
        call_text = f'{{"name": "query", "parameters": {json.dumps(arguments)}}}'
    state = protocol.new_episode("How many users are there?")
    prompt = protocol.prompt(state, tokenizer)
    end = protocol.turns(state).turn_end
    turn = protocol.read_segment(state, call_text + end, "eos")
    protocol.record(state, turn, call_text + end)
    assert [c.to_dict()["arguments"] for c in turn.calls] == [arguments] and turn.kind == "invoke"
    observation = protocol.observation(state, turn, [ToolResult("query", "3")])
    appended = prompt + call_text + end + observation.text + "There are 3 users." + end

    messages = [
        {"role": "system", "content": "You answer from the database."},
        {"role": "user", "content": "How many users are there?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "query", "arguments": arguments}}],
        },
        {"role": "tool", "content": "3", "name": "query"},
        {"role": "assistant", "content": "There are 3 users."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=[QUERY], tokenize=False)
    assert appended == rendered.rstrip(
        "\n"
    )  # ChatML ends the last turn with a newline the model never writes
    # tokenised alone, the tool turn's markers are the special tokens, as in the rendered conversation
    ids = tokenizer(observation.text, add_special_tokens=False)["input_ids"]
    marker = "<|im_start|>" if family == "qwen" else "<|start_header_id|>"
    assert tokenizer.convert_tokens_to_ids(marker) in ids


def test_a_template_without_tools_gets_them_in_a_hermes_system_message(smollm2_tokenizer):
    protocol = ChatToolProtocol(schemas=[QUERY])
    state = protocol.new_episode("How many users?")
    prompt = protocol.prompt(state, smollm2_tokenizer)
    assert '"name": "query"' in prompt and "<tool_call>" in prompt and state.extra["dialect"] == "hermes"
    with pytest.raises(ValueError, match="does not show tools"):
        ChatToolProtocol(schemas=[QUERY], dialect="llama3").prompt(
            protocol.new_episode("q"), smollm2_tokenizer
        )


# ------------------------------------------------------------------------------------------------- parsing
def parsed(text, dialect):
    """(calls as (name, arguments), errors, attempted) of one message."""
    out = parse_calls(text, dialect)
    return [(c.name, c.arguments) for c in out.calls], out.errors, out.attempted


def test_hermes_calls():
    text = (
        '<think>count them</think><tool_call>\n{"name": "query", "arguments": {"sql": "A"}}\n</tool_call>\n'
        '<tool_call>{"name": "query", "arguments": "{\\"sql\\": \\"B\\"}"}</tool_call>'
    )
    assert parsed(text, "hermes") == ([("query", {"sql": "A"}), ("query", {"sql": "B"})], [], True)
    assert parsed('<tool_call>{"name": "query", "arguments": {"sql": ', "hermes") == (
        [],
        ["tool call 1 has no closing </tool_call>"],
        True,
    )
    assert parsed("<tool_call>{name: query}</tool_call>", "hermes")[1][0].startswith(
        "tool call 1 is not valid JSON"
    )
    assert parsed('<tool_call>{"arguments": {}}</tool_call>', "hermes")[1] == [
        'tool call 1 has no "name" string'
    ]
    # a think block mentioning the syntax is not a call
    assert parsed("<think>I could use <tool_call></think>The answer is 3.", "hermes") == ([], [], False)


def test_text_json_cannot_parse_never_raises():
    """A run of digits past Python's 4300-digit int limit, or deep nesting, is a call error, not an exception."""
    digits = '<tool_call>{"name": "q", "arguments": {"n": ' + "1" * 5000 + "}}</tool_call>"
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    for text in (digits, deep):
        calls, errors, attempted = parsed(text, "hermes")
        assert not calls and errors[0].startswith("tool call 1 is not valid JSON") and attempted
    assert parsed('{"name": "q", "parameters": {"n": ' + "1" * 5000 + "}}", "llama3")[1]
    assert parsed("[TOOL_CALLS] " + "[" * 100_000, "mistral")[1]


def test_llama3_calls():
    assert parsed(
        '<|python_tag|>{"name": "query", "parameters": {"sql": "A;B"}}; {"name": "query", "parameters": {}}',
        "llama3",
    ) == ([("query", {"sql": "A;B"}), ("query", {})], [], True)
    assert parsed("There are 3 users.", "llama3") == ([], [], False)
    calls, errors, attempted = parsed('{"name": "query", "parameters": {"sql": ', "llama3")
    assert not calls and errors[0].startswith("tool call 1 is not valid JSON") and attempted
    # a final answer that happens to be JSON, or a set, is an answer; built-in tool code is no JSON call
    assert parsed('{"answer": 3}', "llama3") == ([], [], False) and parsed("{1, 2}", "llama3")[2] is False
    assert parsed("<|python_tag|>brave_search.call(query='x')", "llama3")[1] == [
        "only JSON tool calls are supported, not <|python_tag|> code"
    ]


def test_mistral_calls():
    assert parsed('[TOOL_CALLS] [{"name": "query", "arguments": {"sql": "A"}}]', "mistral")[:2] == (
        [("query", {"sql": "A"})],
        [],
    )
    named = '[TOOL_CALLS]query[ARGS]{"sql": "A"}[TOOL_CALLS]query[ARGS]{"sql": "B"}'
    assert parsed(named, "mistral")[:2] == ([("query", {"sql": "A"}), ("query", {"sql": "B"})], [])
    assert parsed("[TOOL_CALLS] []", "mistral") == (
        [],
        ["[TOOL_CALLS] holds an empty list; include at least one call"],
        True,
    )
    assert parsed("3 users.", "mistral") == ([], [], False)
    with pytest.raises(ValueError, match="unknown dialect"):
        parse_calls("x", "pythonic")


# ------------------------------------------------------------------------------------------------ episodes
@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_episode_with_real_tokens(family, request):
    tokenizer = request.getfixturevalue(family)
    protocol = get_protocol("chat", schemas=[QUERY])
    state_probe = protocol.new_episode("q")
    protocol.prompt(state_probe, tokenizer)
    end = protocol.turns(state_probe).turn_end
    if family == "qwen":
        bad = "<tool_call>{name: query}</tool_call>" + end
        call = (
            '<tool_call>{"name": "query", "arguments": {"sql": "SELECT COUNT(*) FROM users"}}</tool_call>'
            + end
        )
    else:
        bad = '{"name": query}' + end
        call = '{"name": "query", "parameters": {"sql": "SELECT COUNT(*) FROM users"}}' + end
    episode = run_episode(
        protocol, "How many users?", [bad, call, "There are 3 users." + end], {"query": sql},
        pieces=token_pieces(tokenizer), tokenizer=tokenizer,
    )  # fmt: skip
    assert episode.kinds == ["invoke", "invoke", "commit"]
    first, second, last = episode.segments
    assert first.turn.calls == [] and "not valid JSON" in first.observation.text  # an error as a tool result
    assert first.turn.info["format_reward_raw"] == pytest.approx(0.3)  # think (always met) + call block
    assert episode.calls_run == [{"name": "query", "arguments": {"sql": "SELECT COUNT(*) FROM users"}}]
    assert second.turn.info["format_reward_raw"] == pytest.approx(1.0)
    assert last.turn.answer == "There are 3 users." and last.turn.done


def test_a_tool_error_lowers_the_format_reward_and_the_cap_ends_the_episode(qwen):
    protocol = ChatToolProtocol(schemas=[QUERY], max_segments=2)
    state = protocol.new_episode("How many users?")
    protocol.prompt(state, qwen)
    call = '<tool_call>{"name": "query", "arguments": {"sql": "SELECT x"}}</tool_call><|im_end|>'
    turn = protocol.read_segment(state, call, "eos")
    protocol.record(state, turn, call)
    protocol.observation(state, turn, [ToolResult("query", "ERROR: no such table", ok=False)])
    assert turn.info["format_reward_raw"] == pytest.approx(0.45)  # every item but the 0.55 for success
    last = protocol.read_segment(state, call, "eos")
    assert last.done and last.calls == [] and last.info["cut"] == "max_segments" and last.answer is None
    cut = protocol.read_segment(protocol.new_episode("q"), "There are", "length")
    assert cut.done and cut.answer is None and cut.info["truncated"]


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="chat: tool schema 0 has no 'name'"):
        ChatToolProtocol(schemas=[{"description": "query"}])
    with pytest.raises(ValueError, match="dialect"):
        ChatToolProtocol(dialect="pythonic")
    with pytest.raises(ValueError, match="max_segments"):
        ChatToolProtocol(max_segments=0)


def test_prompt_modes_for_the_critic_warm_up(smollm2_tokenizer, qwen):
    """carl-segment's warm-up sets protocol.options.prompt to no_tool / forced; chat once rejected the option."""
    call = '<tool_call>{"name": "query", "arguments": {"sql": "SELECT COUNT(*) FROM users"}}</tool_call>'
    for tokenizer in (smollm2_tokenizer, qwen):  # tools in a Hermes system message / shown by the template
        no_tool = get_protocol("chat", schemas=[QUERY], prompt="no_tool")
        state = no_tool.new_episode("How many users?")
        text = no_tool.prompt(state, tokenizer)
        assert '"query"' not in text and "Do not use any tools." in text
        turn = no_tool.read_segment(state, call, "eos")  # no tool was shown: the message is the answer
        assert turn.kind == "commit" and turn.done and turn.calls == [] and turn.answer == call
        forced = ChatToolProtocol(schemas=[QUERY], prompt="forced", system_prompt="You run a shop.")
        state = forced.new_episode("How many users?")
        text = forced.prompt(state, tokenizer)
        assert "You run a shop. You must use a tool to help answer this question." in text
        assert '"query"' in text and forced.read_segment(state, call, "eos").kind == "invoke"
    plain = ChatToolProtocol(schemas=[QUERY])
    assert "must use" not in plain.prompt(plain.new_episode("q"), smollm2_tokenizer)
    with pytest.raises(ValueError, match="prompt must be one of"):
        ChatToolProtocol(prompt="sometimes")


def test_results_come_back_in_call_order_and_field_errors_keep_the_json_item(qwen):
    protocol = ChatToolProtocol(schemas=[QUERY])
    state = protocol.new_episode("How many users?")
    protocol.prompt(state, qwen)
    text = (
        '<tool_call>{"name": "query", "arguments": ["A"]}</tool_call>'  # parses, but arguments is no object
        '<tool_call>{"name": "query", "arguments": {"sql": "B"}}</tool_call><|im_end|>'
    )
    turn = protocol.read_segment(state, text, "eos")
    protocol.record(state, turn, text)
    assert [c.arguments for c in turn.calls] == [{"sql": "B"}]
    assert turn.info["format_reward_raw"] == pytest.approx(0.4)  # think, call block and JSON; fields fail
    obs = protocol.observation(state, turn, [ToolResult("query", "rows of B")])
    first, second = obs.text.split("</tool_response>")[:2]
    assert (
        '"arguments" must be a JSON object' in first and "rows of B" in second
    )  # the first call's slot first


def test_llama3_end_of_message_token_ends_a_calling_message(llama):
    protocol = ChatToolProtocol(schemas=[QUERY])
    state = protocol.new_episode("How many users?")
    protocol.prompt(state, llama)
    assert protocol.stop_strings(state) == ["<|eot_id|>", "<|eom_id|>"]
    text = '{"name": "query", "parameters": {"sql": "A"}}<|eom_id|>'
    assert protocol.segment_ends(state, text)
    turn = protocol.read_segment(state, text, "stop")
    assert [c.arguments for c in turn.calls] == [{"sql": "A"}] and not turn.info.get("error")
    obs = protocol.observation(state, turn, [ToolResult("query", "3")])
    assert obs.text.startswith("<|start_header_id|>ipython")  # no second end token after <|eom_id|>


def test_tool_turns_from_a_template_that_renders_the_last_assistant_turn_differently(
    smollm2_tokenizer, tmp_path
):
    """Qwen3 adds an empty think block to the last assistant message only; the probe reads one rendering."""
    from transformers import AutoTokenizer

    smollm2_tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.chat_template = QWEN_STYLE.replace(
        "{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}",
        "{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
        "{% if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{{ m.content }}",
    )
    assert ToolTurns.from_tokenizer(tokenizer).open == "\n<|im_start|>user\n<tool_response>\n"


def test_named_templates_use_the_tool_use_one_for_prompt_and_tool_turns(smollm2_tokenizer, qwen):
    """A tokenizer with {"default", "tool_use"} templates: tools= picks tool_use, and so does the probe."""
    import copy

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = {"default": smollm2_tokenizer.chat_template, "tool_use": QWEN_STYLE}
    protocol = ChatToolProtocol(schemas=[QUERY])
    state = protocol.new_episode("q")
    assert "<tools>" in protocol.prompt(state, tokenizer) and state.extra["dialect"] == "hermes"
    assert protocol.turns(state) == ToolTurns.from_tokenizer(qwen)
