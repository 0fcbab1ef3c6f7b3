"""The agent-loop workers' tools: the retrieval client against agentcredit's own Search-R1-API server."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("verl")

from agentcredit.integrations.verl.settings import ToolSettings  # noqa: E402
from agentcredit.integrations.verl.tools import RemoteRetriever, build_runtime, passage_from_document  # noqa: E402
from agentcredit.tools.base import ToolCall  # noqa: E402
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


def test_search_r1_documents_without_title_fields():
    p = passage_from_document({"id": "7", "contents": '"Jane Doe"\nJane Doe wrote X.'}, where="t")
    assert (p.title, p.text) == ("Jane Doe", "Jane Doe wrote X.")
    with pytest.raises(ValueError, match="string 'contents'"):
        passage_from_document({"id": "7"}, where="t")
    with pytest.raises(ValueError, match="http"):
        RemoteRetriever("localhost:8000")
