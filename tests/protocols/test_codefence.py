"""carl-segment's code-fence protocol, driven through whole episodes (carl-segment.md sections 2 and 9)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_helpers import SEEDS, SPECS, run_episode, token_pieces

from agentcredit.protocols import get_protocol
from agentcredit.protocols.base import Turn
from agentcredit.protocols.codefence import (
    FORCED_TOOL_PROMPT,
    MULTIHOP_TOOL_PROMPT,
    NO_TOOL_PROMPT,
    OPTIONAL_TOOL_PROMPT,
    OUTPUT_CLOSE,
    OUTPUT_OPEN,
    SYSTEM_PROMPTS,
    CodeFenceProtocol,
    _fence_lines,
    find_invoke_block,
)
from agentcredit.tools.base import ToolResult

QUESTION = "What is 347 * 28?"


def python_tool(outputs: dict[str, str]):
    """A stand-in for the sandbox: maps code to the stdout it would print."""
    return lambda args: outputs[args["code"]]


# ---------------------------------------------------------------------------------------------- prompts
def _spec_prompts() -> list[str]:
    text = (SPECS / "carl-segment.md").read_text()
    section = text[text.index("### 2.3 Prompts") : text.index("### 2.4")]
    return re.findall(r"   ```\n   (.*?)\n   ```", section, re.S)


def test_system_prompts_are_verbatim_from_the_spec():
    assert _spec_prompts() == [NO_TOOL_PROMPT, FORCED_TOOL_PROMPT, OPTIONAL_TOOL_PROMPT, MULTIHOP_TOOL_PROMPT]


@pytest.mark.skipif(not SEEDS.exists(), reason="needs ../shared/seeds")
def test_system_prompts_agree_with_the_paper():
    paper = (SEEDS / "carl-segment-level-credit.txt").read_text()
    assert f"No-tool direct answer: “{NO_TOOL_PROMPT}”" in paper
    assert f"Forced tool use: “{FORCED_TOOL_PROMPT}”" in paper
    # Prompts 3 and 4 are given in the paper as edits of prompt 2.
    assert "Same as forced tool use but with “You may optionally use” replacing “You must use.”" in paper
    assert OPTIONAL_TOOL_PROMPT == FORCED_TOOL_PROMPT.replace("You must use", "You may optionally use")
    extra = "This question may require multiple search steps. You may call tools more than once."
    assert f"an additional instruction: “{extra}”" in paper
    assert MULTIHOP_TOOL_PROMPT == f"{FORCED_TOOL_PROMPT} {extra}"


def test_messages_use_the_optional_prompt_by_default():
    protocol = get_protocol("codefence")
    state = protocol.new_episode(QUESTION)
    assert protocol.messages(state) == [
        {"role": "system", "content": OPTIONAL_TOOL_PROMPT},
        {"role": "user", "content": QUESTION},
    ]
    for name, text in SYSTEM_PROMPTS.items():
        assert get_protocol("codefence", prompt=name).messages(state)[0]["content"] == text
    assert get_protocol("codefence", system_prompt="Be brief.").messages(state)[0]["content"] == "Be brief."


def test_prompt_renders_with_the_smollm2_chat_template(smollm2_tokenizer):
    protocol = get_protocol("codefence", prompt="forced")
    text = protocol.prompt(protocol.new_episode(QUESTION), smollm2_tokenizer)
    assert text == (
        f"<|im_start|>system\n{FORCED_TOOL_PROMPT}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# ---------------------------------------------------------------------------------------------- episodes
INVOKE = "347 * 28 is not easy to do in my head.\n```python\nprint(347 * 28)\n```\n"
ASSIMILATE = "<context>347 * 28 = 9716</context>"
COMMIT = "The product is \\boxed{9716}."


def test_invoke_assimilate_commit_with_replacement():
    protocol = get_protocol("codefence")
    episode = run_episode(
        protocol,
        QUESTION,
        [INVOKE + "I expect 9716.", ASSIMILATE + "\nSo the answer", COMMIT],
        {"python": python_tool({"print(347 * 28)": "9716\n"})},
    )
    invoke, assimilate, commit = episode.segments
    assert episode.kinds == ["invoke", "assimilate", "commit"]
    # The invoke stops at the closing fence: the text after it is never generated.
    assert invoke.finish == "stop" and invoke.text.rstrip("\n").endswith("print(347 * 28)\n```")
    assert "I expect" not in invoke.text
    assert [c.to_dict() for c in invoke.turn.calls] == [
        {"name": "python", "arguments": {"code": "print(347 * 28)"}, "raw": "print(347 * 28)"}
    ]
    # Spec 2.4 / A3 wrapper; the raw output is transient (replacement mode).
    assert invoke.observation.text == "\n```output\n9716\n```\n"
    assert invoke.observation.transient and invoke.observation.kind == "tool_output"
    # The assimilate ends at </context> and drops the raw output.
    assert assimilate.finish == "stop" and assimilate.text.startswith(ASSIMILATE)
    assert len(assimilate.text) < len(ASSIMILATE) + 5  # at most the rest of the last piece
    assert assimilate.turn.drop_transient and assimilate.observation is None
    assert commit.turn.done and commit.turn.answer == "9716" and commit.finish == "eos"
    # Eq. 9: s = s_0 + t_0 + e_1 + commit; the code stays, the raw output is gone.
    assert episode.context_text == invoke.text + assimilate.text + COMMIT
    assert "```output" not in episode.context_text
    assert episode.state.n_tool_calls == 1


def test_without_replacement_the_raw_output_stays():
    protocol = get_protocol("codefence", replacement=False)
    episode = run_episode(
        protocol, QUESTION, [INVOKE, ASSIMILATE, COMMIT], {"python": python_tool({"print(347 * 28)": "9716"})}
    )
    assert not episode.segments[0].observation.transient
    assert not episode.segments[1].turn.drop_transient
    invoke, assimilate, _ = episode.segments
    assert (
        episode.context_text == invoke.text + OUTPUT_OPEN + "9716" + OUTPUT_CLOSE + assimilate.text + COMMIT
    )


def test_answer_without_tools_is_one_commit():
    episode = run_episode(get_protocol("codefence"), "What is 2 + 2?", ["2 + 2 = \\boxed{4}"])
    assert episode.kinds == ["commit"] and episode.segments[0].turn.answer == "4"


def test_other_fences_do_not_end_the_segment():
    """A28: only a bare fence line closing an open ```python block fires; other fences resume generation."""
    output = (
        "The table:\n```text\n| a | b |\n```\nA bare block:\n```\nx = 1\n```\n"
        "Now code:\n```python\nprint(search('Eiffel Tower height'))\n```\nIgnored."
    )
    episode = run_episode(
        get_protocol("codefence"), "How tall?", [output, ASSIMILATE, COMMIT], {"python": lambda a: "330 m"}
    )
    invoke = episode.segments[0]
    assert invoke.turn.kind == "invoke"
    assert invoke.turn.calls[0].arguments == {"code": "print(search('Eiffel Tower height'))"}
    assert "Ignored" not in invoke.text


def test_fence_variants():
    assert find_invoke_block("```py\nx = 1\n```") is not None  # ```py counts (A28)
    assert find_invoke_block("  ```Python\nx = 1\n  ```  ") is not None  # indentation, case, trailing spaces
    assert (
        find_invoke_block("```python\nx = 1\n```python\n") is None
    )  # a fence with an info string is content
    assert find_invoke_block("see ```python\nx = 1\n```") is None  # an inline mention opens no block
    assert find_invoke_block("```python\nprint('```')\n```").code == "print('```')"  # backticks inside a line
    assert find_invoke_block("```python\n```").code == ""  # an empty block still runs (and prints nothing)
    block = find_invoke_block("```python\nfor i in range(3):\n    print(i)\n\n```")
    assert block.code == "for i in range(3):\n    print(i)\n"


def test_unclosed_python_block_at_eos_is_a_commit():
    output = "Let me think.\n```python\nx = 2 + 2\nThe answer is \\boxed{4}"
    episode = run_episode(get_protocol("codefence"), "2 + 2?", [output])
    turn = episode.segments[0].turn
    assert turn.kind == "commit" and turn.done and turn.answer == "4"


def test_stray_context_tag_does_not_end_invoke_or_commit():
    output = "Odd </context> tag.\n```python\nprint(1)\n```"
    episode = run_episode(
        get_protocol("codefence"),
        "q?",
        [output, "<context>1</context>", "Done </context> \\boxed{1}"],
        {"python": lambda a: "1"},
    )
    assert episode.kinds == ["invoke", "assimilate", "commit"]
    assert episode.segments[0].text.startswith("Odd </context> tag.")
    assert episode.segments[2].text == "Done </context> \\boxed{1}" and episode.segments[2].turn.answer == "1"


def test_assimilate_eos_without_context_tag_is_a_commit():
    """A5(a): the raw output stays and the segment is the commit."""
    episode = run_episode(
        get_protocol("codefence"),
        QUESTION,
        [INVOKE, "The output says 9716, so \\boxed{9716}"],
        {"python": lambda a: "9716"},
    )
    second = episode.segments[1].turn
    assert second.kind == "commit" and second.done and second.answer == "9716"
    assert not second.drop_transient and "error" in second.info
    assert "```output\n9716" in episode.context_text


def test_assimilate_budget_cut_is_closed_by_the_environment():
    """A5(b): 256-token budget; the truncated extraction is closed by an env </context> and the episode goes on."""
    protocol = get_protocol("codefence")
    state = protocol.new_episode(QUESTION)
    assert protocol.max_new_tokens(state, 2048) == 2048
    state.turns.append(Turn("invoke"))
    assert protocol.max_new_tokens(state, 2048) == 256 and protocol.max_new_tokens(state, 100) == 100

    long_extraction = "<context>" + "word " * 400  # far more than 256 pieces
    episode = run_episode(
        protocol,
        QUESTION,
        [INVOKE, long_extraction, COMMIT],
        {"python": lambda a: "9716"},
        default_budget=2048,
    )
    assimilate = episode.segments[1]
    assert assimilate.finish == "length" and len(assimilate.text) <= 256 * 5
    assert assimilate.turn.kind == "assimilate" and assimilate.turn.info["truncated"]
    assert assimilate.turn.drop_transient
    assert assimilate.observation.text == "</context>" and not assimilate.observation.transient
    assert episode.kinds == ["invoke", "assimilate", "commit"]
    assert episode.context_text == episode.segments[0].text + assimilate.text + "</context>" + COMMIT


def test_segment_cap_forces_a_commit():
    """A6: 15 segments; tools allowed only while invoke + assimilate + commit fit; then a forced commit."""
    protocol = get_protocol("codefence")
    loop = "Search again.\n```python\nprint(search('x'))\n```\n"
    forced = "One more:\n```python\nprint(search('y'))\n```\nI must answer now: \\boxed{Paris}"
    outputs = [loop, "<context>nothing</context>"] * 7 + [forced]
    episode = run_episode(protocol, "Capital of France?", outputs, {"python": lambda a: "Doc 1 (Title: x) y"})
    assert episode.kinds == ["invoke", "assimilate"] * 7 + ["commit"]
    assert len(episode.segments) == 15 and episode.state.n_tool_calls == 7
    last = episode.segments[-1]
    # The python block inside the forced commit does not stop generation; the boxed answer after it counts.
    assert last.finish == "eos" and last.text == forced
    assert last.turn.info["forced_commit"] and last.turn.answer == "Paris" and not last.turn.calls


def test_small_cap_and_no_tool_prompt():
    protocol = get_protocol("codefence", max_segments=2)
    state = protocol.new_episode("q?")
    assert not protocol.tools_allowed(state) and protocol.stop_strings(state) == []
    no_tool = get_protocol("codefence", prompt="no_tool")
    code = "```python\nprint(4)\n```\n\\boxed{4}"
    episode = run_episode(no_tool, "2+2?", [code])
    assert episode.kinds == ["commit"] and episode.segments[0].turn.answer == "4"
    assert get_protocol("codefence", prompt="no_tool", tools=True).tools


def test_stop_strings_follow_the_state_machine():
    protocol = get_protocol("codefence")
    state = protocol.new_episode("q?")
    assert protocol.stop_strings(state) == ["```"]
    state.turns.append(Turn("invoke"))
    assert protocol.stop_strings(state) == ["</context>"]


def test_answer_extraction_with_nested_braces_and_missing_answer():
    episode = run_episode(get_protocol("codefence"), "Half?", ["It is \\boxed{\\frac{1}{2}} (not \\boxed{x"])
    assert episode.segments[0].turn.answer == "\\frac{1}{2}"
    missing = run_episode(get_protocol("codefence"), "Half?", ["I do not know."]).segments[0].turn
    assert missing.done and missing.answer is None and "boxed" in missing.info["error"]


def test_token_cap_in_an_invoke_is_a_truncated_commit():
    episode = run_episode(
        get_protocol("codefence"), "q?", ["```python\n" + "x = 1\n" * 100], default_budget=10
    )
    turn = episode.segments[0].turn
    assert turn.kind == "commit" and turn.done and turn.answer is None and turn.info["truncated"]


def test_failed_tool_output_is_shown_in_the_wrapper():
    protocol = get_protocol("codefence")
    state = protocol.new_episode("q?")
    turn = protocol.read_segment(state, INVOKE, "stop")
    protocol.record(state, turn, INVOKE)
    error = "Traceback (most recent call last):\nZeroDivisionError: division by zero"
    obs = protocol.observation(state, turn, [ToolResult("python", error, ok=False)])
    assert obs.text == f"\n```output\n{error}\n```\n"
    with pytest.raises(ValueError, match="tool results"):
        protocol.observation(state, turn, [])


def test_with_real_tokens(smollm2_tokenizer):
    """The same episode fed with SmolLM2's own tokens (fences and tags split however the tokenizer splits)."""
    pieces = token_pieces(smollm2_tokenizer)
    outputs = [INVOKE + "x", ASSIMILATE + "y", COMMIT]
    episode = run_episode(
        get_protocol("codefence"), QUESTION, outputs, {"python": lambda a: "9716"}, pieces=pieces
    )
    assert episode.kinds == ["invoke", "assimilate", "commit"]
    assert episode.segments[0].text.rstrip("\n").endswith("```")
    assert episode.segments[1].text == ASSIMILATE and episode.segments[2].turn.answer == "9716"


def test_invalid_options():
    with pytest.raises(ValueError, match="prompt must be one of"):
        CodeFenceProtocol(prompt="sometimes")
    with pytest.raises(ValueError, match="max_segments"):
        CodeFenceProtocol(max_segments=0)
    with pytest.raises(ValueError, match="assimilate_tokens"):
        CodeFenceProtocol(assimilate_tokens=0)
    with pytest.raises(ValueError, match="non-empty string"):
        CodeFenceProtocol().new_episode("  ")


# ---------------------------------------------------------------------------------------------- properties
_prose = st.text(st.characters(codec="ascii", exclude_characters="`\r"), max_size=30)
_code_line = st.text(st.characters(codec="ascii", exclude_characters="\n\r"), max_size=25).filter(
    lambda s: not s.lstrip().startswith("```")
)
_other_block = st.tuples(
    st.sampled_from(["```", "```text", "```json", "```bash"]), st.lists(_prose, max_size=3)
)


@settings(max_examples=150, deadline=None)
@given(
    before=st.lists(
        st.one_of(_prose.map(lambda s: ("prose", s)), _other_block.map(lambda b: ("block", b))), max_size=4
    ),
    lang=st.sampled_from(["python", "py", "python3"]),
    code=st.lists(_code_line, max_size=5),
    after=_prose,
    seed=st.integers(0, 10_000),
)
def test_invoke_stops_exactly_at_the_first_closing_python_fence(before, lang, code, after, seed):
    """Whatever prose and non-python blocks come first, and however the text is cut into pieces, the segment
    ends with the fence closing the first python block, and the code is recovered exactly."""
    lines = []
    for kind, item in before:
        if kind == "prose":
            lines.append(item.replace("\n", " "))
        else:
            opener, body = item
            lines += [opener, *(b.replace("\n", " ") for b in body), "```"]
    prefix = "\n".join(lines) + ("\n" if lines else "")
    block = f"```{lang}\n" + "".join(c + "\n" for c in code) + "```"
    output = prefix + block + "\n" + after
    from protocol_helpers import chunk_pieces

    episode = run_episode(
        get_protocol("codefence"),
        "q?",
        [output, "<context>c</context>", "\\boxed{1}"],
        {"python": lambda a: "out"},
        pieces=lambda text: chunk_pieces(text, seed=seed),
    )
    invoke = episode.segments[0]
    assert invoke.turn.kind == "invoke"
    assert invoke.turn.calls[0].arguments["code"] == "\n".join(code)
    assert invoke.text.startswith(prefix + block)
    assert len(invoke.text) < len(prefix + block) + 5  # at most the rest of the last piece


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["`", "```", " ", "\t", "\n", "a", "python"]), max_size=30).map("".join))
def test_fence_line_scanner_matches_its_regex_definition(text):
    """The hand-written scanner finds exactly the lines of the regex ^[ \t]*```[^\n]*$ (multiline)."""
    expected = [(m.start(), m.end()) for m in re.finditer(r"^[ \t]*```[^\n]*$", text, re.MULTILINE)]
    assert list(_fence_lines(text)) == expected


def test_segment_ends_is_cheap_per_token():
    """Called after every token: its cost must not grow with the segment length (tail checks only)."""
    import time

    protocol = get_protocol("codefence")
    state = protocol.new_episode("q?")
    after_tool = protocol.new_episode("q?")
    after_tool.turns.append(Turn("invoke"))

    def per_call_seconds(state, text: str, n: int = 2000) -> float:
        best = float("inf")
        for _ in range(3):  # the machine is shared: keep the best of three
            start = time.perf_counter()
            for _ in range(n):
                protocol.segment_ends(state, text)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    short = "Some reasoning.\n```python\nprint(1)\n"
    long = "Some reasoning, line after line.\n" * 6000 + "```python\nprint(1)\n"  # ~200 KB
    for st_ in (state, after_tool):
        t_short, t_long = per_call_seconds(st_, short), per_call_seconds(st_, long)
        assert t_long < 50e-6, f"segment_ends took {t_long * 1e6:.1f} us on a 200 KB segment"
        assert t_long < 10 * t_short + 5e-6, (t_short, t_long)
