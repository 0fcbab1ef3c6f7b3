"""Search as an HTTP service that speaks Search-R1's retrieval-server protocol (which verl's SearchTool calls).

``POST /retrieve`` with ``{"queries": [str, ...], "topk": int | null, "return_scores": bool}`` answers
``{"result": [[doc, ...], ...]}``, one list per query, or ``[[{"document": doc, "score": float}, ...], ...]`` when
``return_scores`` is true. ``doc`` is ``{"id", "title", "text", "contents"}``, ``contents`` being Search-R1's
``"<title>"\\n<text>``, the field both Search-R1's ``_passages2string`` and verl's ``search_r1_like_utils`` read.
``GET /health`` answers ``{"status": "ok", ...}``. So ``retrieval_service_url: http://127.0.0.1:8000/retrieve``
in a verl tool config, or ``search_url`` in Search-R1, can point here unchanged.

Differences from Search-R1's FastAPI server, all on the strict side: ``topk`` must be a positive integer or
null (Search-R1 silently treats 0 as "default"), and requests are bounded (body size, number of queries, topk).
Errors are ``{"detail": message}`` with a 4xx status, FastAPI's shape.

The server is the standard library's ThreadingHTTPServer: one small JSON endpoint does not justify a web
framework dependency, and retrieval is thread-safe, so a thread per connection is all the concurrency needed.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentcredit.tools.search import DEFAULT_TOPK, Retriever, load_retriever

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20  # 1 MiB: thousands of queries; anything bigger is a client bug or abuse
MAX_QUERIES = 4096
MAX_TOPK = 1000


class RequestError(Exception):
    """A client error: HTTP status and a message for the ``detail`` field."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_retrieve_request(payload: Any, *, default_topk: int) -> tuple[list[str], int, bool]:
    """Validate a decoded ``/retrieve`` body; returns (queries, topk, return_scores) or raises RequestError."""
    bad = HTTPStatus.UNPROCESSABLE_ENTITY
    if not isinstance(payload, dict):
        raise RequestError(bad, f"request body must be a JSON object, got {type(payload).__name__}")
    if "queries" not in payload:
        raise RequestError(bad, "field 'queries' is required (a list of query strings)")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise RequestError(bad, f"field 'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > MAX_QUERIES:
        raise RequestError(
            bad, f"field 'queries' has {len(queries)} entries; at most {MAX_QUERIES} per request"
        )
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(bad, f"field 'queries[{i}]' must be a string, got {type(q).__name__}")
    topk = payload.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise RequestError(bad, f"field 'topk' must be an integer or null, got {type(topk).__name__}")
    elif not 1 <= topk <= MAX_TOPK:
        raise RequestError(bad, f"field 'topk' must be between 1 and {MAX_TOPK}, got {topk}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(
            bad, f"field 'return_scores' must be true or false, got {type(return_scores).__name__}"
        )
    return queries, topk, return_scores


def retrieve_response(
    retriever: Retriever, queries: list[str], topk: int, return_scores: bool
) -> dict[str, Any]:
    """The body Search-R1's server returns for a validated request."""
    result = []
    for hits in retriever.batch_retrieve(queries, topk):
        if return_scores:
            result.append([{"document": h.passage.to_document(), "score": h.score} for h in hits])
        else:
            result.append([h.passage.to_document() for h in hits])
    return {"result": result}


class _Handler(BaseHTTPRequestHandler):
    server: SearchServer
    protocol_version = "HTTP/1.1"  # keep-alive: verl's client reuses connections

    def setup(self) -> None:
        # Seconds a connection may stay silent (idle keep-alive, or a body that never arrives): a stalled client
        # must not hold a thread forever.
        self.timeout = self.server.request_timeout
        super().setup()

    def _send(self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, {"detail": message}, headers)

    def _route(self) -> str | None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        return path if path in ("/retrieve", "/health") else None

    def _wrong_method(self) -> None:
        route = self._route()
        if route is None:
            self._drain_and_close()
            self._error(
                HTTPStatus.NOT_FOUND, f"no such endpoint {self.path!r}; use POST /retrieve or GET /health"
            )
            return
        allowed = "POST" if route == "/retrieve" else "GET"
        self._drain_and_close()
        self._error(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{self.command} is not allowed on {route}; use {allowed}",
            {"Allow": allowed},
        )

    def _drain_and_close(self) -> None:
        # We do not read bodies we reject, so the connection cannot be reused for the next request.
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's naming)
        if self._route() == "/health":
            srv = self.server
            self._send(
                HTTPStatus.OK,
                {"status": "ok", "retriever": srv.retriever_name, "passages": len(srv.retriever.passages)},
            )
        else:
            self._wrong_method()

    do_HEAD = do_GET
    do_PUT = do_DELETE = do_PATCH = _wrong_method

    def do_POST(self) -> None:  # noqa: N802
        if self._route() != "/retrieve":
            self._wrong_method()
            return
        try:
            payload = self._read_json()
            queries, topk, return_scores = parse_retrieve_request(
                payload, default_topk=self.server.default_topk
            )
        except RequestError as exc:
            self._error(exc.status, exc.message)
            return
        try:
            body = retrieve_response(self.server.retriever, queries, topk, return_scores)
        except Exception as exc:  # a retriever bug must give the client a 500, not a dropped connection
            log.exception("retrieval failed")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"retrieval failed: {type(exc).__name__}: {exc}")
            return
        self._send(HTTPStatus.OK, body)

    def _read_json(self) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._drain_and_close()
            raise RequestError(
                HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not supported; send Content-Length"
            )
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self._drain_and_close()
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            self._drain_and_close()
            raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {length_header!r}") from None
        limit = self.server.max_body_bytes
        if length > limit:
            self._drain_and_close()
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body is {length} bytes; the limit is {limit} bytes",
            )
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            self._drain_and_close()
            raise RequestError(HTTPStatus.REQUEST_TIMEOUT, "timed out reading the request body") from None
        if len(raw) != length:
            self._drain_and_close()
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body ended after {len(raw)} of {length} bytes")
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RequestError(HTTPStatus.BAD_REQUEST, "request body is not valid UTF-8") from None
        except json.JSONDecodeError as exc:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            ) from None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.info("%s - %s", self.address_string(), format % args)


class SearchServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer bound to one retriever. ``port=0`` picks a free port (see ``server_address``)."""

    daemon_threads = True

    def __init__(
        self,
        retriever: Retriever,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        default_topk: int = DEFAULT_TOPK,
        max_body_bytes: int = MAX_BODY_BYTES,
        retriever_name: str | None = None,
        request_timeout: float = 60.0,
    ):
        if not 1 <= default_topk <= MAX_TOPK:
            raise ValueError(f"default_topk must be between 1 and {MAX_TOPK}, got {default_topk}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {port}")
        self.retriever = retriever
        self.default_topk = default_topk
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.retriever_name = retriever_name or type(retriever).__name__
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/retrieve"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    corpus: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    topk: int = DEFAULT_TOPK,
    dense: bool = False,
    model_path: str | os.PathLike[str] | None = None,
) -> None:
    """Load the corpus, then serve until interrupted (the ``agentcredit serve-search`` command)."""
    retriever = load_retriever(Path(corpus), dense=dense, model_path=model_path)
    server = SearchServer(
        retriever, host=host, port=port, default_topk=topk, retriever_name="dense" if dense else "bm25"
    )
    if not is_loopback(host):
        log.warning("serving on %s: the search service is reachable from other machines", host)
    print(f"serving {len(retriever.passages)} passages ({server.retriever_name}) at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
