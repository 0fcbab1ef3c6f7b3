"""The agent-loop workers' tools: the retrieval client against agentcredit's own Search-R1-API server."""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import os
import shutil
import socket
import sys
import threading
import time

import pytest

pytest.importorskip("verl")

from agentcredit.integrations.verl.settings import ToolSettings  # noqa: E402
from agentcredit.integrations.verl.tools import RemoteRetriever, build_runtime, passage_from_document  # noqa: E402
from agentcredit.tools.base import ToolCall, ToolUnavailableError  # noqa: E402
from agentcredit.tools.search import BM25Search, passage_from_row  # noqa: E402
from agentcredit.tools.search.server import SearchServer  # noqa: E402

pytestmark = pytest.mark.verl

ROWS = [
    {"id": "p0", "title": "Jane Doe", "text": "Jane Doe wrote the novel X in 1901."},
    {"id": "p1", "title": "Paris", "text": "Paris is the capital of France."},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    passages = [passage_from_row(r, where="t", default_id=r["id"]) for r in ROWS]
    srv = SearchServer(
        BM25Search(passages, cache_dir=tmp_path_factory.mktemp("idx")), host="127.0.0.1", port=0
    )
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_remote_retriever_speaks_the_search_r1_api(server):
    client = RemoteRetriever(server.url, topk=1)
    (hits,) = client.retrieve(["who wrote X"])
    assert [p.id for p in hits] == ["p0"] and hits[0].title == "Jane Doe"
    assert client.search("who wrote X") == 'Doc 1(Title: "Jane Doe") Jane Doe wrote the novel X in 1901.\n'
    assert client.search("   ").startswith("ERROR:")


def test_runtime_tools_never_raise(server, tmp_path):
    runtime = build_runtime(ToolSettings(search_url=server.url, search_topk=1))
    (ok,) = runtime.run([ToolCall("search", {"query": "capital of France"})])
    assert ok.ok and "Paris is the capital of France." in ok.output
    down = build_runtime(ToolSettings(search_url="http://127.0.0.1:9/retrieve", search_timeout=2.0))
    (failed,) = down.run([ToolCall("search", {"query": "x"})])
    assert not failed.ok and failed.output.startswith("ERROR: search failed")
    assert failed.infra  # the machine's failure (issue 36): the agent loop leaves the episode out


class _SlowRetrieve(http.server.BaseHTTPRequestHandler):
    """A Search-R1 /retrieve endpoint that records each request's queries and answers each query with itself."""

    requests: list[list[str]] = []
    delay = 0.0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(list(body["queries"]))
        time.sleep(type(self).delay)
        result = [[{"id": q, "contents": f'"{q}"\nabout {q}'}] for q in body["queries"]]
        data = json.dumps({"result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    _SlowRetrieve.requests, _SlowRetrieve.delay = [], 0.0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowRetrieve)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/retrieve"
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_concurrent_queries_go_in_batches(slow_server):
    """issue 36: 16 episodes searching at once (the worker's tool threads) make 2 requests of 8, not 16; each
    caller gets its own passages."""
    client = RemoteRetriever(slow_server, topk=1, batch_size=8, batch_wait=5.0)
    queries = [f"q{i}" for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(client.search, queries))
    assert client.requests == 2 and sorted(len(r) for r in _SlowRetrieve.requests) == [8, 8]
    assert answers == [f'Doc 1(Title: "{q}") about {q}\n' for q in queries]


def test_a_lone_query_goes_after_the_wait(slow_server):
    client = RemoteRetriever(slow_server, topk=1, batch_size=8, batch_wait=0.05)
    assert client.search("alone") == 'Doc 1(Title: "alone") about alone\n'
    assert _SlowRetrieve.requests == [["alone"]]


def test_a_search_timeout_is_an_infrastructure_failure(slow_server):
    """The retriever is overloaded (answers after the timeout): every caller of the batch gets infra text, in
    the sandbox's search() too (it raises there, so the python call is marked as well)."""
    _SlowRetrieve.delay = 2.0
    runtime = build_runtime(
        ToolSettings(search_url=slow_server, search_timeout=0.3, search_batch_size=4, search_batch_wait=0.2)
    )
    results = runtime.run([ToolCall("search", {"query": f"q{i}"}) for i in range(4)])
    assert all(
        r.infra and not r.ok and "search failed" in r.output and "timed out" in r.output for r in results
    )
    from agentcredit.integrations.verl.tools import _sandbox_search

    with pytest.raises(ToolUnavailableError, match="search failed"):
        _sandbox_search(RemoteRetriever(slow_server, timeout=0.3), "q", 1)


def test_search_r1_documents_without_title_fields():
    p = passage_from_document({"id": "7", "contents": '"Jane Doe"\nJane Doe wrote X.'}, where="t")
    assert (p.title, p.text) == ("Jane Doe", "Jane Doe wrote X.")
    with pytest.raises(ValueError, match="string 'contents'"):
        passage_from_document({"id": "7"}, where="t")
    with pytest.raises(ValueError, match="http"):
        RemoteRetriever("localhost:8000")


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox runs code as an unprivileged uid only when the worker is root"
)
def test_sandbox_preflight_says_what_to_change_when_the_interpreter_is_unreadable(tmp_path):
    """issue 36: a root Ray worker without bubblewrap runs the sandbox's code as an unprivileged uid, which cannot
    read an interpreter under a 0700 directory (a venv under /root, as many images have). The preflight stops the
    worker with one message naming the node, the directory, and the verl keys or packages that fix it."""
    from agentcredit.tools import sandbox

    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    shutil.copy2(os.path.realpath(sys.executable), python)
    previous = sandbox.configure()
    try:
        with pytest.raises(ToolUnavailableError) as err:
            build_runtime(
                ToolSettings(python=True, python_isolation="rlimits", python_interpreter=str(python))
            )
    finally:
        sandbox.configure(python=previous.python)
    message = str(err.value)
    assert message.startswith(f"agentcredit.tools.python on node {socket.gethostname()} (uid 0)")
    assert "keeps the sandbox uid from" in message and str(python) in message  # the directory in the way
    for fix in (
        "bubblewrap",
        "agentcredit.tools.python_interpreter",
        "chmod o+rx",
        "python_isolation=rlimits",
    ):
        assert fix in message


def test_sandbox_interpreter_setting_is_checked_on_the_node(tmp_path):
    """A python_interpreter that is not an executable file on the worker's node is named in one line."""
    for bad in ("python3", str(tmp_path / "missing" / "python")):
        with pytest.raises(ToolUnavailableError, match="python_interpreter=.* is not an absolute path"):
            build_runtime(ToolSettings(python=True, python_interpreter=bad))


def test_sandbox_runs_with_a_readable_interpreter_in_the_fallback_mode():
    """The same rlimits fallback with an interpreter every uid can read (the system's): the tool answers."""
    from agentcredit.tools import sandbox

    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 in /usr/bin or /bin")
    previous = sandbox.configure()
    try:
        runtime = build_runtime(
            ToolSettings(python=True, python_isolation="rlimits", python_interpreter=system)
        )
        (result,) = runtime.run([ToolCall("python", {"code": "print(6 * 7)"})])
    finally:
        sandbox.configure(python=previous.python)
    assert result.ok and result.output == "42\n"
