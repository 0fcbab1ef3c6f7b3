"""``search()`` inside the python sandbox whose index cannot be read is an infrastructure failure.

The sandbox answers the code's ``search()`` from the host's retriever. When the retriever fails because it cannot
run (an ``OSError``: the index files vanished; or a :class:`ToolUnavailableError`), the code still sees an
exception, but the python tool's result is marked ``infra`` so the episode is never trained on or scored. A
retriever that rejects the query (a ``ValueError``) is an ordinary answer, as before.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from agentcredit.tools.base import ToolCall, ToolRuntime, ToolUnavailableError
from agentcredit.tools.sandbox import SandboxResult, python_tool
from agentcredit.tools.sandbox import tool as ps
from agentcredit.tools.search import BM25Search, Passage

TEST_UID_BASE, TEST_UID_COUNT = 1_996_420, 8

PASSAGE = Passage("1", "Paris", "Paris is in France.", '"Paris"\nParis is in France.')


@pytest.fixture
def working_sandbox(monkeypatch):
    previous = ps.configure(uid_base=TEST_UID_BASE, uid_count=TEST_UID_COUNT)
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    try:
        ps.sandbox_mode()
    except RuntimeError as exc:
        ps.configure(**asdict(previous))
        pytest.skip(f"no sandbox can run here: {exc}")
    yield
    ps.configure(**asdict(previous))


def _run(tool, code: str):
    runtime = ToolRuntime({"python": tool})
    try:
        return runtime.run_one(ToolCall("python", {"code": code}))
    finally:
        runtime.close()


def _index_failing_with(monkeypatch, exc: Exception) -> BM25Search:
    index = BM25Search([PASSAGE], use_cache=False)

    def failing(*args, **kwargs):
        raise exc

    monkeypatch.setattr(index, "retrieve", failing)
    return index


def test_search_in_the_sandbox_with_an_unreadable_index_is_an_infrastructure_failure(
    working_sandbox, monkeypatch
):
    index = _index_failing_with(monkeypatch, FileNotFoundError("index/params.index.json"))
    result = _run(python_tool(index, timeout=10.0), "print(search('Paris'))")
    assert "index/params.index.json" in result.output  # what went wrong is still in the text
    assert result.infra and not result.ok
    assert result.to_dict()["infra"] is True


def test_the_mark_holds_even_when_the_code_catches_the_failure(working_sandbox, monkeypatch):
    index = _index_failing_with(monkeypatch, ToolUnavailableError("retrieval backend is down"))
    code = "try:\n    search('Paris')\nexcept Exception as e:\n    print('no luck:', e)\n"
    result = _run(python_tool(index, timeout=10.0), code)
    assert "no luck" in result.output and "retrieval backend is down" in result.output
    assert result.infra and not result.ok


def test_a_search_that_works_or_rejects_the_query_is_an_answer(working_sandbox, monkeypatch):
    ok = _run(python_tool(BM25Search([PASSAGE], use_cache=False), timeout=10.0), "print(search('Paris'))")
    assert "Paris is in France." in ok.output and ok.ok and not ok.infra
    index = _index_failing_with(monkeypatch, ValueError("k must be a positive integer"))
    rejected = _run(python_tool(index, timeout=10.0), "print(search('Paris'))")
    assert "k must be a positive integer" in rejected.output and not rejected.infra


def test_marking_does_not_need_a_sandbox(monkeypatch):
    """The same decision without running a sandbox: a stand-in run_python answers search() as the session does."""

    def fake_run_python(code, *, limits, search_fn, isolation):
        try:
            text = search_fn("Paris", 3)
        except Exception as exc:  # the session reports it to the code, which prints it
            text = f"search() failed: {type(exc).__name__}: {exc}"
        return SandboxResult(True, text + "\n", mode="rlimits")

    monkeypatch.setattr(ps, "run_python", fake_run_python)
    for exc, infra in [
        (PermissionError("index unreadable"), True),
        (ToolUnavailableError("gone"), True),
        (ValueError("bad query"), False),
        (TypeError("query must be a string"), False),
    ]:

        def search_fn(query, k, exc=exc):
            raise exc

        result = _run(python_tool(search_fn), "print(search('Paris'))")
        assert result.infra is infra, (exc, result)
        assert str(exc) in result.output
    fine = _run(python_tool(lambda q, k: "Paris is in France."), "print(search('Paris'))")
    assert fine.ok and not fine.infra and fine.output == "Paris is in France.\n"
