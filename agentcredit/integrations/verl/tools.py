"""The tools an agent-loop worker runs: agentcredit's tools, with search answered by a retrieval server.

verl runs agent loops in Ray actors spread over the cluster, so the search index lives in one retrieval
server (``agentcredit serve-search``, or Search-R1's own E5 server: same API) and every worker calls it over
HTTP. :class:`RemoteRetriever` is that client; it answers both the ``search`` tool of the tags protocol and
the ``search()`` function inside the python sandbox (carl-segment's code fences). The HTTP client is the
standard library's: one JSON POST does not justify a dependency.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from functools import partial
from typing import Any

from agentcredit.tools.base import ToolRuntime, ToolUnavailableError, UnavailableText, unavailable
from agentcredit.tools.search import EMPTY_QUERY_TEXT, Passage, format_passages, no_results_text

__all__ = [
    "QueryBatcher",
    "RemoteRetriever",
    "build_runtime",
    "check_python_sandbox",
    "passage_from_document",
]


def passage_from_document(doc: Any, *, where: str) -> Passage:
    """A Search-R1 document (``{"id", "contents"}``, plus ``title``/``text`` from agentcredit's server)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("contents", doc.get("text")), str):
        raise ValueError(f"{where}: expected a document with a string 'contents', got {doc!r:.200}")
    contents = doc.get("contents")
    title, text = doc.get("title"), doc.get("text")
    if contents is None:
        contents = f'"{title or ""}"\n{text}'
    if title is None or text is None:
        first, _, rest = contents.partition("\n")
        title = first.strip().strip('"') if title is None else title
        text = rest if text is None else text
    return Passage(id=str(doc.get("id", "")), title=str(title), text=str(text), contents=contents)


class QueryBatcher:
    """Gathers the queries that callers (the worker's tool threads) send within ``wait`` seconds, at most ``size``
    of them with the same k, into one request: Search-R1's API takes a list of queries, so 1,280 concurrent
    episodes need not make 1,280 HTTP requests. The first caller of a batch waits for the others and sends it;
    every caller gets its own passages, or the request's exception."""

    def __init__(self, fetch: Any, size: int, wait: float):
        self.fetch, self.size, self.wait = fetch, size, wait
        self._cond = threading.Condition()
        self._open: dict[int | None, list[tuple[str, Future]]] = {}  # the batch still taking queries, per k

    def submit(self, query: str, k: int | None) -> list[Passage]:
        future: Future = Future()
        with self._cond:
            batch = self._open.get(k)
            leader = batch is None
            if leader:
                batch = self._open[k] = []
            batch.append((query, future))
            if len(batch) >= self.size:  # full: later queries start a new batch
                del self._open[k]
                self._cond.notify_all()
        if leader:
            deadline = time.monotonic() + self.wait
            with self._cond:
                while self._open.get(k) is batch and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                if self._open.get(k) is batch:
                    del self._open[k]
            try:
                results = self.fetch([q for q, _ in batch], k)
            except BaseException as exc:  # every caller of the batch sees the request's failure
                for _, f in batch:
                    f.set_exception(exc)
            else:
                for (_, f), passages in zip(batch, results, strict=True):
                    f.set_result(passages)
        return future.result()


class RemoteRetriever:
    """Client of a Search-R1 retrieval server (``POST url {"queries", "topk", "return_scores"}``).

    ``batch_size > 1`` batches concurrent :meth:`search` calls of this process (:class:`QueryBatcher`). A request
    that fails (timeout, connection refused, a malformed answer) is the machine's failure, not the model's: the
    tool's text is marked :func:`~agentcredit.tools.base.unavailable`, so the runtime marks the call ``infra`` and
    the agent loop leaves the episode out instead of showing the model ``ERROR: search failed``.
    """

    def __init__(
        self,
        url: str,
        *,
        topk: int = 3,
        timeout: float = 30.0,
        style: str = "search-r1",
        batch_size: int = 1,
        batch_wait: float = 0.0,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"search_url must be an http(s) URL of a /retrieve endpoint, got {url!r}")
        self.url, self.topk, self.timeout, self.style = url, topk, timeout, style
        self.requests = 0  # HTTP requests sent (one per batch)
        self._batcher = QueryBatcher(self.retrieve, batch_size, batch_wait) if batch_size > 1 else None

    def retrieve(self, queries: list[str], k: int | None = None) -> list[list[Passage]]:
        body = json.dumps({"queries": queries, "topk": k or self.topk, "return_scores": False}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        self.requests += 1
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (configured URL)
            payload = json.loads(response.read())
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise ValueError(
                f"{self.url}: expected {{'result': [...]}} with {len(queries)} lists, got {payload!r:.200}"
            )
        return [
            [passage_from_document(d, where=f"{self.url} result[{i}][{j}]") for j, d in enumerate(docs)]
            for i, docs in enumerate(result)
        ]

    def search(self, query: str, k: int | None = None) -> str:
        """Formatted passages for one query. An empty query is the model's mistake (an answer it reads); a request
        that fails is an infrastructure failure (:func:`~agentcredit.tools.base.unavailable` text)."""
        if not isinstance(query, str) or not query.strip():
            return EMPTY_QUERY_TEXT
        try:
            if self._batcher is not None:
                passages = self._batcher.submit(query, k)
            else:
                (passages,) = self.retrieve([query], k)
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            return unavailable(f"search failed ({self.url}, timeout {self.timeout:g} s): {exc}")
        return format_passages(passages, self.style) if passages else no_results_text(query)


#: What an agent-loop node needs for the python tool, and the keys that change it (docs/scaling-out-with-verl.md).
SANDBOX_NODE_FIX = (
    "Every node that runs agent-loop workers needs bubblewrap able to create namespaces there (Debian "
    "package 'bubblewrap'; in a container, one that allows user namespaces). The rlimits fallback, for trusted code "
    "only, runs only when asked for (agentcredit.tools.python_isolation=rlimits); when the worker runs as root it "
    "needs an interpreter the sandbox's unprivileged uid can read and execute: set "
    "agentcredit.tools.python_interpreter to one (e.g. /usr/bin/python3, with the packages your task's code "
    "imports), or make the directories named above readable by others (chmod o+rx)"
)


def check_python_sandbox(settings: Any) -> None:
    """The sandbox preflight of an agent-loop worker (``print(1)`` as ``tools.build.build_tools`` runs it, once
    per process): raise :class:`ToolUnavailableError` naming this node and what to install or change on it."""
    import socket

    from agentcredit.tools.sandbox import check_available, configure

    where = f"agentcredit.tools.python on node {socket.gethostname()} (uid {os.geteuid()})"
    interpreter = settings.python_interpreter
    if interpreter is not None:
        if not (
            os.path.isabs(interpreter) and os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)
        ):
            raise ToolUnavailableError(
                f"{where}: agentcredit.tools.python_interpreter={interpreter!r} is not an absolute path to an "
                "executable file on this node"
            )
        configure(python=interpreter)
    try:
        check_available(settings.python_isolation)
    except ToolUnavailableError as exc:
        raise ToolUnavailableError(f"{where}: {exc}. {SANDBOX_NODE_FIX}") from exc


def _sandbox_search(retriever: RemoteRetriever, query: str, k: int) -> str:
    """``search()`` inside the python sandbox: a failed request raises, so the sandbox marks the python call as
    an infrastructure failure (its output is then not the tool's answer) instead of handing the code the text."""
    text = retriever.search(query, k)
    if isinstance(text, UnavailableText):
        raise ToolUnavailableError(text)
    return text


#: MCP servers this worker process started; they live as long as the process (verl's workers are long-lived).
_RESOURCES: list[Any] = []


def _close_resources() -> None:
    while _RESOURCES:
        _RESOURCES.pop().close()


atexit.register(_close_resources)


def build_runtime(settings: Any, protocol: str = "tags") -> ToolRuntime:
    """The tool runtime for ``settings.tools`` (a :class:`~.settings.ToolSettings`), your own ``functions`` and
    ``mcp`` servers' tools included (:func:`agentcredit.tools.build.load_user_tools`, as the native trainer), or
    your per-episode ``environment`` (:func:`agentcredit.tools.build.load_episode_environments`; ``protocol`` chat).

    Raises :class:`~agentcredit.tools.base.ToolUnavailableError` when ``settings.python`` is on and the sandbox
    cannot run ``print(1)`` (the same preflight, and message, as ``tools.build.build_tools``).
    """
    from agentcredit.tools.build import load_episode_environments, load_user_tools

    episodes = load_episode_environments(settings, protocol)
    if episodes is not None and (settings.suite or settings.search_url or settings.python):
        raise ValueError(
            "agentcredit.tools.environment gets every call of an episode: turn off tools.suite, tools.search_url "
            "and tools.python, and list the environment's tools in its class"
        )
    tools: dict[str, Any] = {tool.name: tool for tool in load_user_tools(settings, _RESOURCES)}
    if settings.suite:
        from agentcredit.tools.suite import build_suite

        corpus = os.path.expanduser(settings.suite_corpus) if settings.suite_corpus else None
        tools.update(build_suite(corpus, knowledge_k=settings.search_topk))
    retriever = None
    if settings.search_url:
        retriever = RemoteRetriever(
            settings.search_url,
            topk=settings.search_topk,
            timeout=settings.search_timeout,
            style=settings.search_format,
            batch_size=settings.search_batch_size,
            batch_wait=settings.search_batch_wait,
        )

        def search(arguments: dict[str, Any]) -> str:
            query = arguments.get("query") if isinstance(arguments, dict) else None
            return retriever.search(query if isinstance(query, str) else "")

        tools["search"] = search
    if settings.python:
        from agentcredit.tools.sandbox import python_tool

        check_python_sandbox(settings)
        tools["python"] = python_tool(
            None if retriever is None else partial(_sandbox_search, retriever),
            timeout=settings.python_timeout,
            isolation=settings.python_isolation,
        )
    return ToolRuntime(tools, max_workers=settings.max_workers, episodes=episodes)
