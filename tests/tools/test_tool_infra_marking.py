"""A tool that cannot run is an infrastructure failure, marked as such; the code's own errors are answers.

Issue 11, item 2: a broken sandbox turned every tool call into ``ERROR: the python sandbox is unavailable: ...``
and that text went into demonstrations and evaluation episodes as if the tool had answered. Now such results carry
``ToolResult.infra``, and building a task's environment checks the sandbox up front (``check_available``).
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from agentcredit.tools.base import ToolCall, ToolRuntime, ToolUnavailableError, unavailable
from agentcredit.tools.sandbox import SandboxResult, check_available, python_tool, tool_text
from agentcredit.tools.sandbox import tool as ps
from agentcredit.tools.search import BM25Search, Passage

TEST_UID_BASE, TEST_UID_COUNT = 1_996_400, 8


@pytest.fixture
def restore_sandbox(monkeypatch):
    """Settings, resolved modes and preflight results come back as they were after the test."""
    previous = ps.configure(uid_base=TEST_UID_BASE, uid_count=TEST_UID_COUNT)
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    yield
    ps.configure(**asdict(previous))


@pytest.fixture
def working_sandbox(restore_sandbox):
    try:
        ps.sandbox_mode()
    except RuntimeError as exc:
        pytest.skip(f"no sandbox can run here: {exc}")


def _run(tool, code: str):
    runtime = ToolRuntime({"python": tool})
    try:
        return runtime.run_one(ToolCall("python", {"code": code}))
    finally:
        runtime.close()


def test_an_unavailable_sandbox_is_marked_as_an_infrastructure_failure(monkeypatch):
    def broken(isolation="bwrap"):
        raise ToolUnavailableError("bubblewrap is not installed")

    monkeypatch.setattr(ps, "sandbox_mode", broken)
    result = _run(python_tool(), "print(1)")
    assert result.output == "ERROR: the python sandbox is unavailable: bubblewrap is not installed"
    assert not result.ok and result.infra
    assert result.to_dict()["infra"] is True  # the engine keeps to_dict() in the episode's segment info


def test_a_sandbox_that_cannot_be_set_up_is_an_infrastructure_failure():
    setup = SandboxResult(False, "", "sandbox setup failed (exit status 1): bwrap: execvp ...", "setup")
    assert tool_text(setup).startswith("ERROR: sandbox setup failed")
    runtime = ToolRuntime({"python": lambda args: tool_text(setup)})
    result = runtime.run_one(ToolCall("python", {"code": "print(1)"}))
    runtime.close()
    assert result.infra and not result.ok


def test_the_codes_own_failures_are_answers_not_infrastructure(working_sandbox):
    raised = _run(python_tool(timeout=5.0), "1 / 0")
    assert "ZeroDivisionError" in raised.output and not raised.infra
    stopped = _run(python_tool(timeout=1.0), "while True: pass")
    assert stopped.output.startswith("ERROR: timeout") and not stopped.ok and not stopped.infra
    # the words alone do not make an infrastructure failure: the mark is the tool's, not the text's
    forged = _run(python_tool(timeout=5.0), "print('ERROR: the python sandbox is unavailable: forged')")
    assert forged.output.startswith("ERROR: the python sandbox is unavailable") and not forged.infra


def test_a_tool_raising_tool_unavailable_is_marked_and_other_errors_are_not():
    def gone(args):
        raise ToolUnavailableError("index directory removed")

    def bug(args):
        raise KeyError("x")

    runtime = ToolRuntime({"gone": gone, "bug": bug, "plain": lambda a: "ERROR: bad arguments"})
    try:
        results = runtime.run([ToolCall("gone"), ToolCall("bug"), ToolCall("plain"), ToolCall("nope")])
    finally:
        runtime.close()
    assert [r.infra for r in results] == [True, False, False, False]
    assert "index directory removed" in results[0].output and not results[0].ok
    assert type(results[0].output) is str and unavailable("x") == "ERROR: x"


def test_search_index_that_cannot_be_read_is_an_infrastructure_failure(monkeypatch):
    passage = Passage("1", "Paris", "Paris is in France.", '"Paris"\nParis is in France.')
    index = BM25Search([passage], use_cache=False)
    tool = index.as_tool()

    def vanished(*args, **kwargs):
        raise FileNotFoundError("index/params.index.json")

    monkeypatch.setattr(index, "retrieve", vanished)
    runtime = ToolRuntime({"search": tool})
    result = runtime.run_one(ToolCall("search", {"query": "Paris"}))
    runtime.close()
    assert result.infra and result.output.startswith("ERROR: the search index is unavailable")


def test_preflight_runs_print_1_and_names_what_to_fix(restore_sandbox, tmp_path):
    ps.configure(python=str(tmp_path / "no-such-python"))
    with pytest.raises(ToolUnavailableError) as caught:
        check_available()
    message = str(caught.value)
    assert "the python sandbox cannot run code here" in message
    assert "To fix it: install bubblewrap" in message and "configure(python=...)" in message
    assert isinstance(caught.value, RuntimeError)  # callers that caught RuntimeError still do


def test_preflight_passes_once_and_is_remembered(working_sandbox, monkeypatch):
    check_available()
    calls = []
    monkeypatch.setattr(ps, "run_python", lambda *a, **k: calls.append(a))
    check_available()
    assert calls == []  # the second environment of a process does not pay for another sandbox run
