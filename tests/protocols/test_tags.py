"""The tag protocol in its three styles: Search-R1, ASearcher (carl-critical) and TIPS (verl tool calling)."""

from __future__ import annotations

import json
import re

import pytest
from protocol_helpers import SEEDS, SPECS, run_episode, stops_at, token_pieces

from agentcredit.protocols import get_protocol
from agentcredit.protocols.base import Turn
from agentcredit.protocols.chat import CHATML, ChatMarkers
from agentcredit.protocols.tags import (
    ASEARCHER_CHUNK_CHARS,
    ASEARCHER_INVALID_SENTENCE,
    ASEARCHER_VALID_SENTENCE,
    QWEN_TOOLS_BAD_QUERY_LIST,
    QWEN_TOOLS_SYSTEM_PROMPT,
    QWEN_TOOLS_USER_PREFIX,
    SEARCH_R1_INSTRUCTION,
    SEARCH_R1_INVALID_ACTION,
    TagsProtocol,
)

QUESTION = "who wrote the novel on which the film Blade Runner is based"
DOCS = {
    "Blade Runner source novel": "Doc 1 (Title: Blade Runner) Based on Do Androids Dream of Electric Sheep?",
    "Do Androids Dream of Electric Sheep author": "Doc 1 (Title: Philip K. Dick) Author of the 1968 novel.",
}


def search_tool(args):
    return DOCS.get(args["query"], "")


# ---------------------------------------------------------------------------------------------- Search-R1
def test_search_r1_instruction_and_messages():
    protocol = get_protocol("tags")
    messages = protocol.messages(protocol.new_episode("  " + QUESTION + " "))
    # Search-R1 strips the question and ends it with "?" (scripts/data_process/nq_search.py).
    assert messages == [
        {"role": "user", "content": SEARCH_R1_INSTRUCTION.replace("{question}", QUESTION + "?")}
    ]
    content = messages[0]["content"]
    assert content.startswith(
        "Answer the given question. You must conduct reasoning inside <think> and </think>"
    )
    assert "You can search as many times as your want." in content  # the source's typo, kept
    assert content.endswith(f"For example, <answer> Beijing </answer>. Question: {QUESTION}?\n")


def test_search_r1_prompt_with_the_smollm2_template(smollm2_tokenizer):
    protocol = get_protocol("tags")
    text = protocol.prompt(protocol.new_episode("Is the sky blue?"), smollm2_tokenizer)
    # No system message (Search-R1's data has only a user turn), so SmolLM2's template adds its default one.
    user = SEARCH_R1_INSTRUCTION.replace("{question}", "Is the sky blue?")
    assert text.endswith(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def test_search_r1_episode_search_then_answer():
    protocol = get_protocol("tags")
    outputs = [
        "<think>I need the novel.</think>\n<search> Blade Runner source novel </search>\n<information>fake",
        "<think>Now its author.</think><search>Do Androids Dream of Electric Sheep author</search>",
        "<think>Philip K. Dick wrote it.</think>\n<answer> Philip K. Dick </answer> and more text",
    ]
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool})
    assert episode.kinds == ["search", "search", "answer"]
    first = episode.segments[0]
    assert first.finish == "stop" and stops_at(first.text, "</search>")
    assert "<information>fake" not in first.text  # generation stopped at </search>
    assert first.turn.calls[0].to_dict()["arguments"] == {"query": "Blade Runner source novel"}
    # Search-R1's wrapper: "\n\n<information>" + result.strip() + "</information>\n\n".
    assert first.observation.text == (
        "\n\n<information>Doc 1 (Title: Blade Runner) Based on Do Androids Dream of Electric Sheep?</information>\n\n"
    )
    last = episode.segments[-1]
    assert last.turn.done and last.turn.answer == "Philip K. Dick" and stops_at(last.text, "</answer>")
    assert [c["arguments"]["query"] for c in episode.calls_run] == list(DOCS)


def test_search_r1_invalid_action_gets_the_corrective_observation():
    protocol = get_protocol("tags")
    outputs = ["I think it was Philip K. Dick.", "<answer>Philip K. Dick</answer>"]
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool})
    invalid = episode.segments[0]
    assert invalid.finish == "eos" and invalid.turn.kind == "invalid" and not invalid.turn.done
    assert invalid.observation.text == SEARCH_R1_INVALID_ACTION
    assert SEARCH_R1_INVALID_ACTION == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
        "Let me try again.\n"
    )
    assert episode.segments[1].turn.answer == "Philip K. Dick"
    assert episode.calls_run == []


def test_search_r1_budget_ends_without_running_the_last_search():
    protocol = get_protocol("tags")
    outputs = [f"<search>query {i}</search>" for i in range(10)]
    episode = run_episode(protocol, QUESTION, outputs, {"search": lambda a: "nothing"})
    assert episode.kinds == ["search"] * 5
    assert len(episode.calls_run) == 4  # 4 searches, then the final generation's search is not run
    last = episode.segments[-1].turn
    assert last.done and last.answer is None and last.info["cut"] == "max_segments" and last.calls == []


def test_search_r1_first_action_wins_and_answers_may_nest_braces():
    protocol = get_protocol("tags")
    state = protocol.new_episode(QUESTION)
    # A segment normally stops at its first closing tag; if a backend hands over more, the first pair counts.
    turn = protocol.read_segment(state, "<answer>{a {b}}</answer><search>x</search>", "stop")
    assert turn.kind == "answer" and turn.answer == "{a {b}}"
    assert protocol.extract_answer("<answer>x</answer> <answer> {y: {z}} </answer>") == "{y: {z}}"
    assert protocol.extract_answer("no answer <answer>unclosed") is None


def test_search_r1_with_read_actions():
    protocol = get_protocol("tags", read=True)
    outputs = [
        "<search>Blade Runner source novel</search>",
        "The film is based on Do Androids Dream of Electric Sheep?</think>\n<search>should not be here",
        "<answer>Philip K. Dick</answer>",
    ]
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool})
    assert episode.kinds == ["search", "read", "answer"]
    assert episode.segments[0].observation.text.endswith("</information>\n\n<think>\n")
    read = episode.segments[1]
    assert stops_at(read.text, "</think>") and read.observation is None and read.finish == "stop"


# ---------------------------------------------------------------------------------------------- ASearcher
def test_asearcher_prompt():
    protocol = get_protocol("tags", style="asearcher")
    state = protocol.new_episode("Who wrote it")
    text = protocol.prompt(state, tokenizer=None)  # raw text, no chat template
    assert text.startswith("A conversation between User and Assistant.")
    assert "<access> url </access>" in text
    assert text.endswith(
        "User: \n\nWho wrote it. \n\nThe language of your answer should align with the question. \n\n"
        "Assistant: \n<think>\n"
    )
    # Valid questions only: the "invalid question" sentence is swapped (carl-critical-actions.md 2.3).
    assert ASEARCHER_INVALID_SENTENCE not in text and ASEARCHER_VALID_SENTENCE in text
    search_only = get_protocol("tags", style="asearcher", access=False).prompt(state, None)
    assert "<access>" not in search_only and ASEARCHER_VALID_SENTENCE in search_only


def test_asearcher_search_read_access_read_answer():
    protocol = get_protocol("tags", style="asearcher")
    page = "A" * ASEARCHER_CHUNK_CHARS + "B" * 10  # two chunks
    tools = {"search": search_tool, "access": lambda a: page if a["url"] == "https://wiki/PKD" else ""}
    outputs = [
        "I should search.\n</think>\n<search> Blade Runner source novel </search>",
        "The novel is Do Androids Dream of Electric Sheep?\n</think>\n<answer>too early",  # a read stops at </think>
        "<think>Open the page.</think>\n<access>https://wiki/PKD</access>",
        "Page 1 is all A.\n</think>",
        "Page 2 ends in B.\n</think>",
        "<think>Done.</think>\n<answer> Philip K. Dick </answer>",
    ]
    episode = run_episode(protocol, QUESTION, outputs, tools)
    assert episode.kinds == ["search", "read", "access", "read", "read", "answer"]
    search = episode.segments[0]
    assert search.observation.text == (
        "\n\n<information>\nDoc 1 (Title: Blade Runner) Based on Do Androids Dream of Electric Sheep?\n"
        "</information>\n<think>\n"
    )
    read = episode.segments[1]
    assert stops_at(read.text, "</think>") and "too early" not in read.text and read.observation is None
    chunk1, chunk2 = episode.segments[2].observation.text, episode.segments[3].observation.text
    assert (
        chunk1
        == "\n\n<information>\n>>>> Page 1 >>>>\n\n"
        + "A" * ASEARCHER_CHUNK_CHARS
        + "\n</information>\n<think>\n"
    )
    assert chunk2 == "\n\n<information>\n>>>> Page 2 >>>>\n\n" + "B" * 10 + "\n</information>\n<think>\n"
    assert episode.segments[4].observation is None  # nothing left to read
    assert episode.segments[-1].turn.answer == "Philip K. Dick"
    assert [c["name"] for c in episode.calls_run] == ["search", "access"]


def test_asearcher_information_is_read_in_order():
    """ASearcher's queue: a search made while a page is still being read is shown after the page's chunks."""
    protocol = get_protocol("tags", style="asearcher")
    page = "A" * ASEARCHER_CHUNK_CHARS + "B"
    outputs = [
        "<access>https://wiki/PKD</access>",
        "Chunk A. Also <search>Blade Runner source novel</search> then </think>",
        "Chunk B.</think>",
        "The search says Do Androids Dream.</think>",
        "<answer>Philip K. Dick</answer>",
    ]
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool, "access": lambda a: page})
    assert episode.kinds == ["access", "search", "read", "read", "answer"]
    shown = [s.observation.text if s.observation else None for s in episode.segments[:-1]]
    assert ">>>> Page 1 >>>>" in shown[0] and ">>>> Page 2 >>>>" in shown[1]
    assert "Doc 1 (Title: Blade Runner)" in shown[2] and shown[3] is None


def test_asearcher_empty_results_eos_and_budget():
    protocol = get_protocol("tags", style="asearcher", max_segments=3)
    episode = run_episode(
        protocol,
        QUESTION,
        ["<search>nothing here</search>", "Nothing.</think>", "<search>again</search>"],
        {"search": lambda a: ""},
    )
    assert "No search results are found." in episode.segments[0].observation.text
    assert episode.segments[-1].turn.info["cut"] == "max_segments"
    # EOS ends an ASearcher episode, with or without an answer.
    eos = run_episode(get_protocol("tags", style="asearcher"), QUESTION, ["I give up."])
    assert eos.segments[0].turn.done and eos.segments[0].turn.answer is None


def test_asearcher_priority_when_one_output_holds_several_actions():
    protocol = get_protocol("tags", style="asearcher")
    state = protocol.new_episode(QUESTION)
    turn = protocol.read_segment(state, "<access>u</access><search>a</search><search>b</search>", "stop")
    assert turn.kind == "search" and turn.calls[0].arguments == {"query": "b"}  # last match, search first


# ---------------------------------------------------------------------------------------------- TIPS
def _spec_tips_blocks() -> list[str]:
    text = (SPECS / "tips.md").read_text()
    section = text[text.index("### 2.3 Prompt templates") : text.index("### 2.4")]
    return re.findall(r"```\n(.*?)\n```", section, re.S)


def test_tips_prompts_are_verbatim_from_the_spec():
    system, user = _spec_tips_blocks()
    assert system == QWEN_TOOLS_SYSTEM_PROMPT
    assert user == QWEN_TOOLS_USER_PREFIX + "{question}"


@pytest.mark.skipif(not SEEDS.exists(), reason="needs ../shared/seeds")
def test_tips_prompts_agree_with_the_paper():
    """The paper renders the prompt twice and not identically: Fig. 8 (a token heatmap, "as you want", a
    schema whose braces the PDF lost) and Fig. 12 ("as your want", verl's pydantic dump with "enum": null).
    We follow the released code, which is Fig. 12's wording and Fig. 8's schema (tips.md 2.3)."""
    paper = " ".join((SEEDS / "tips.txt").read_text().split())
    assert " ".join(QWEN_TOOLS_USER_PREFIX.split()) in paper  # Fig. 12, word for word
    tools_line = QWEN_TOOLS_SYSTEM_PROMPT.split("<tools>\n")[1].split("\n</tools>")[0]
    schema = json.loads(tools_line)  # the schema line is valid JSON
    assert schema["function"]["parameters"]["required"] == ["query_list"]
    assert schema["function"]["description"] in paper


def tips_call(*queries: str) -> str:
    call = json.dumps({"name": "search", "arguments": {"query_list": list(queries)}})
    return f"<tool_call>\n{call}\n</tool_call>"


def test_tips_episode_with_chat_markers():
    protocol = get_protocol("tags", style="qwen-tools")
    outputs = [
        "<think>Find the novel and its author.</think>\n"
        + tips_call("Blade Runner source novel", "Do Androids Dream of Electric Sheep author"),
        "<think>It is Philip K. Dick.</think>\n<answer> Philip K. Dick </answer>",
    ]
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool})
    search, answer = episode.segments
    assert (
        search.turn.kind == "search" and search.finish == "eos"
    )  # the turn ends at EOS, not at </tool_call>
    assert [c.arguments for c in search.turn.calls] == [{"query": q} for q in DOCS]
    result = "\n---\n".join(DOCS.values())
    assert search.observation.text == (
        "\n<|im_start|>user\n<tool_response>\n"
        + json.dumps({"result": result}, ensure_ascii=False)
        + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert answer.turn.done and answer.turn.answer == "Philip K. Dick"


def test_tips_length_limit_ends_the_episode():
    protocol = get_protocol("tags", style="qwen-tools")
    turn = protocol.read_segment(
        protocol.new_episode(QUESTION), "<think>x</think>" + tips_call("q"), "length"
    )
    assert turn.done and turn.calls == [] and turn.answer is None and turn.info["truncated"]


def test_tips_turn_end_is_added_when_the_model_did_not_emit_it():
    protocol = get_protocol("tags", style="qwen-tools")
    state = protocol.new_episode(QUESTION)
    text = "<think>x</think>" + tips_call("q")
    turn = protocol.read_segment(state, text, "stop")  # e.g. a backend stopping on a stop string
    protocol.record(state, turn, text)
    obs = protocol.observation(state, turn, [_result("Doc 1 (Title: T) body")])
    assert obs.text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n")
    # A backend that decodes special tokens shows the end of turn in the text.
    turn2 = protocol.read_segment(state, text + "<|im_end|>", "stop")
    assert turn2.info["turn_end_generated"]
    assert protocol.segment_ends(state, text + "<|im_end|>") and not protocol.segment_ends(state, text)


def _result(output: str, ok: bool = True):
    from agentcredit.tools.base import ToolResult

    return ToolResult("search", output, ok=ok)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '<tool_call>{"name": "lookup", "arguments": {"query_list": ["x"]}}</tool_call>',
            "unknown tool 'lookup'",
        ),
        (
            '<tool_call>{"name": "search", "arguments": {"query_list": "x"}}</tool_call>',
            QWEN_TOOLS_BAD_QUERY_LIST,
        ),
        (
            '<tool_call>{"name": "search", "arguments": {"query_list": []}}</tool_call>',
            QWEN_TOOLS_BAD_QUERY_LIST,
        ),
    ],
)
def test_tips_bad_calls_get_an_error_response(text, error):
    protocol = get_protocol("tags", style="qwen-tools")
    state = protocol.new_episode(QUESTION)
    turn = protocol.read_segment(state, text, "eos")
    protocol.record(state, turn, text)
    assert not turn.done and turn.calls == [] and error in turn.info["error"]
    obs = protocol.observation(state, turn, [])
    payload = obs.text.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    assert error in json.loads(payload)["result"]


def test_tips_unparsable_tool_call_ends_the_episode():
    """verl's Hermes parser skips a block whose JSON fails; a turn without a tool call ends the episode."""
    protocol = get_protocol("tags", style="qwen-tools")
    episode = run_episode(
        protocol, QUESTION, ['<think>x</think><tool_call>{"name": "search", "arguments": </tool_call>']
    )
    turn = episode.segments[0].turn
    assert turn.done and turn.answer is None and "valid JSON" in turn.info["error"]


def test_tips_budget():
    protocol = get_protocol("tags", style="qwen-tools")
    episode = run_episode(
        protocol, QUESTION, [tips_call(f"q{i}") for i in range(6)], {"search": lambda a: "d"}
    )
    assert len(episode.segments) == 5 and len(episode.calls_run) == 4
    assert episode.segments[-1].turn.info["cut"] == "max_segments"


def test_tips_contexts_equal_the_chat_template_rendering(smollm2_tokenizer):
    """Appending the observation text reproduces what the chat template renders for the same conversation, so
    token-id contexts built by appending match a re-rendered transcript (issue 4, tips.md 2.2)."""
    protocol = get_protocol("tags", style="qwen-tools")
    state = protocol.new_episode(QUESTION)
    prompt = protocol.prompt(state, smollm2_tokenizer)
    assert protocol.markers(state) == CHATML  # SmolLM2 speaks ChatML
    assistant = "<think>x</think>\n" + tips_call("Blade Runner source novel")
    turn = protocol.read_segment(state, assistant, "eos")
    protocol.record(state, turn, assistant)
    obs = protocol.observation(state, turn, [_result(DOCS["Blade Runner source novel"])])
    appended = prompt + assistant + "<|im_end|>" + obs.text
    tool_content = obs.text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    rendered = smollm2_tokenizer.apply_chat_template(
        [
            *protocol.messages(state),
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": tool_content},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert appended == rendered
    # Tokenised alone, the markers become the special tokens.
    ids = smollm2_tokenizer(obs.text, add_special_tokens=False)["input_ids"]
    assert smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>") in ids


def test_chat_markers_from_tokenizer(smollm2_tokenizer):
    assert ChatMarkers.from_tokenizer(smollm2_tokenizer) == CHATML

    class NoTemplate:
        def apply_chat_template(self, *args, **kwargs):
            raise ValueError("no chat template")

    with pytest.raises(ValueError, match="chat_markers"):
        ChatMarkers.from_tokenizer(NoTemplate())


# ---------------------------------------------------------------------------------------------- all styles
@pytest.mark.parametrize("style", ["search-r1", "asearcher", "qwen-tools"])
def test_styles_with_real_tokens(smollm2_tokenizer, style):
    pieces = token_pieces(smollm2_tokenizer)
    protocol = get_protocol("tags", style=style)
    first = (
        tips_call("Blade Runner source novel")
        if style == "qwen-tools"
        else "<think>search</think>\n<search>Blade Runner source novel</search> trailing"
    )
    outputs = [first, "Read it.</think>" if style == "asearcher" else "", "<answer>Philip K. Dick</answer>"]
    if style != "asearcher":
        outputs.pop(1)
    episode = run_episode(protocol, QUESTION, outputs, {"search": search_tool}, pieces=pieces)
    assert episode.segments[-1].turn.answer == "Philip K. Dick"
    assert episode.calls_run == [{"name": "search", "arguments": {"query": "Blade Runner source novel"}}]


def test_invalid_options():
    with pytest.raises(ValueError, match="style must be one of"):
        TagsProtocol(style="react")
    # the style's name before issue 53 (named after the method, not the chat format): the one line names the new one
    with pytest.raises(ValueError, match=r"style must be one of \[.*'qwen-tools'\], got 'tips'"):
        TagsProtocol(style="tips")
    with pytest.raises(ValueError, match="not part of the qwen-tools style"):
        TagsProtocol(style="qwen-tools", read=True)
    with pytest.raises(ValueError, match="does not describe <access>"):
        TagsProtocol(access=True)
    with pytest.raises(ValueError, match="placeholder"):
        TagsProtocol(instruction="Answer it.")
    with pytest.raises(ValueError, match="max_segments"):
        TagsProtocol(max_segments=0)
    custom = TagsProtocol(access=True, instruction="Use <search> or <access>. Q: {question}")
    assert custom.messages(custom.new_episode("x"))[0]["content"] == "Use <search> or <access>. Q: x?"


def test_segment_ends_is_cheap_per_token():
    import time

    protocol = get_protocol("tags")
    state = protocol.new_episode(QUESTION)
    read_state = get_protocol("tags", style="asearcher").new_episode(QUESTION)
    read_state.extra["tags_read_next"] = True
    read_state.turns.append(Turn("search"))

    def per_call(state, text, n=2000):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                protocol.segment_ends(state, text)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    short, long = "<think>a</think>", "<think>" + "reasoning " * 20_000  # ~200 KB
    for st_ in (state, read_state):
        assert per_call(st_, long) < 20e-6
        assert per_call(st_, long) < 10 * per_call(st_, short) + 5e-6


def test_render_search_writes_the_styles_call():
    """A scripted demonstration writes its searches through the protocol (agentcredit.train.demos names no style)."""
    assert get_protocol("tags").render_search("Paris") == "<search>Paris</search>"
    assert get_protocol("tags", style="asearcher").render_search("Paris") == "<search>Paris</search>"
    call = get_protocol("tags", style="qwen-tools").render_search("Paris")
    assert call == '<tool_call>\n{"name": "search", "arguments": {"query_list": ["Paris"]}}\n</tool_call>'
