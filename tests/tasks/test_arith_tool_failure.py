"""arith-tools' tool that can hurt: seeded failures (empty, garbled, off-by-one output), reproducible in every
process, at the asked rate, part of the environment and never disguising an infrastructure failure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tasks import arith, load_task
from agentcredit.tools.base import ToolCall, UnavailableText, unavailable

CODES = [f"print({a}*{b})" for a in range(100, 140) for b in range(11, 61)]  # 2,000 programs


def test_the_failure_of_a_program_is_seeded_and_the_same_in_another_process():
    here = [arith.tool_failure(c, 0.4, 7) for c in CODES[:300]]
    script = (
        "import json; from agentcredit.tasks import arith; "
        f"print(json.dumps([arith.tool_failure(c, 0.4, 7) for c in {CODES[:300]!r}]))"
    )
    there = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert here == there
    assert here != [arith.tool_failure(c, 0.4, 8) for c in CODES[:300]]  # another seed, other failures
    assert set(here) == {None, *arith.TOOL_FAILURE_MODES}


def test_rate_zero_never_fails_and_rate_one_always_does():
    assert all(arith.tool_failure(c, 0.0, 0) is None for c in CODES[:200])
    assert all(arith.tool_failure(c, 1.0, 0) is not None for c in CODES[:200])


@settings(max_examples=12, deadline=None)
@given(rate=st.floats(0.05, 0.95), seed=st.integers(0, 10_000))
def test_the_failure_share_is_the_rate(rate, seed):
    share = sum(arith.tool_failure(c, rate, seed) is not None for c in CODES) / len(CODES)
    sigma = (rate * (1 - rate) / len(CODES)) ** 0.5
    assert abs(share - rate) < 4.5 * sigma


def test_the_corrupted_outputs_by_hand():
    assert arith.corrupt_output("9716\n", "empty", "c", 0) == ""
    assert arith.corrupt_output("9716\n", "garbled", "c", 0) == "6205\n"  # d -> (7d + 3) mod 10
    shifted = arith.corrupt_output("9716 and -5\n", "off_by_one", "c", 0)
    assert shifted in ("9717 and -4\n", "9715 and -6\n")
    with pytest.raises(ValueError):
        arith.corrupt_output("1", "melted", "c", 0)


def test_errors_and_infrastructure_failures_pass_through_unchanged():
    outputs = iter(["ERROR: NameError", unavailable("the sandbox cannot start"), "42\n"])
    tool = arith.failing_tool(lambda args: next(outputs), 1.0, 0)
    assert tool({"code": "x"}) == "ERROR: NameError"
    infra = tool({"code": "x"})
    assert isinstance(infra, UnavailableText)  # still an infrastructure failure, never the tool's answer
    assert tool({"code": "print(6*7)"}) != "42\n"  # rate 1: an ordinary answer always fails


def test_the_rate_is_a_checked_task_option():
    questions = load_task("arith-tools", split="train", limit=6, seed=0)
    same = load_task(
        "arith-tools", split="train", limit=6, seed=0, tool_failure_rate=0.4, tool_failure_seed=3
    )
    assert [q.to_dict() for q in questions] == [q.to_dict() for q in same]  # the questions do not change
    with pytest.raises(ValueError, match="tool_failure_rate"):
        load_task("arith-tools", split="train", limit=2, tool_failure_rate=1.5)


def test_the_environment_of_the_task_option_has_the_failing_tool():
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment

    cfg = load_config(
        "grpo-arith-tools", ["model.name=tiny", "task.options={tool_failure_rate: 1.0, tool_failure_seed: 0}"]
    )
    env = build_environment(cfg)
    try:
        result = env.tools.run_one(ToolCall("python", {"code": "print(2+3)"}))
    finally:
        env.close()
    assert result.output in ("", "8\n", "4\n", "6\n") and not result.infra  # part of the environment
    clean = build_environment(load_config("grpo-arith-tools", ["model.name=tiny"]))
    try:
        assert clean.tools.run_one(ToolCall("python", {"code": "print(2+3)"})).output == "5\n"
    finally:
        clean.close()


def test_the_tool_wrapper_is_the_failing_tool_only_when_the_options_ask_for_failures():
    assert arith.tool_wrapper({}) is None and arith.tool_wrapper({"tool_failure_rate": 0.0}) is None
    wrap = arith.tool_wrapper(
        {"tool_failure_rate": 1.0, "tool_failure_seed": 3, "tool_failure_modes": ["empty"]}
    )
    tool = wrap(lambda arguments: "42\n")
    assert tool({"code": "print(6*7)"}) == ""  # rate 1, mode empty: every ordinary answer comes back empty
    with pytest.raises(ValueError, match="tool_failure_rate"):
        arith.tool_wrapper({"tool_failure_rate": 1.5})(lambda arguments: "")  # checked when the tool is made
