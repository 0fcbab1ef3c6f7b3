"""Search as an HTTP service that speaks Search-R1's retrieval-server protocol (which verl's SearchTool calls).

``POST /retrieve`` with ``{"queries": [str, ...], "topk": int | null, "return_scores": bool}`` answers
``{"result": [[doc, ...], ...]}``, one list per query, or ``[[{"document": doc, "score": float}, ...], ...]`` when
``return_scores`` is true. ``doc`` is ``{"id", "title", "text", "contents"}``, ``contents`` being Search-R1's
``"<title>"\\n<text>``, the field both Search-R1's ``_passages2string`` and verl's ``search_r1_like_utils`` read.
``GET /health`` answers ``{"status": "ok", ...}``. So ``retrieval_service_url: http://127.0.0.1:8000/retrieve``
in a verl tool config, or ``search_url`` in Search-R1, can point here unchanged.

Differences from Search-R1's FastAPI server, all on the strict side: ``topk`` must be a positive integer or
null (Search-R1 silently treats 0 as "default"), and requests are bounded (body size, number of queries, topk,
and results per request = queries x topk, which bounds the response's size and the server's memory). Errors are
``{"detail": message}`` with a 4xx status, FastAPI's shape; past ``max_concurrency`` connections and requests in
flight, uvicorn answers ``503 Service Unavailable`` in plain text (Search-R1's and verl's clients retry a 503).

The HTTP layer is uvicorn (h11) running a Starlette app, not hand-written: a large listen backlog, an event loop
instead of a thread per connection (a slow client costs a coroutine, not a thread), quiet handling of clients
that hang up. Two limits uvicorn does not set are added here: a deadline for a request's headers (uvicorn bounds
idle keep-alive connections only, so a client trickling header bytes would be held forever), one for its
body, and one for the client to take an answer once the server's writes stall (``_HeaderDeadlineH11``). Retrieval runs in a worker thread so a long batch does not stall other connections.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import struct
import sys
import threading
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11
import uvicorn
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentcredit.tools.search import DEFAULT_TOPK, Retriever, load_retriever

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20  # 1 MiB: thousands of queries; anything bigger is a client bug or abuse
MAX_QUERIES = 4096
MAX_TOPK = 1000
# queries x topk per request. Each bounded alone, their product was not: 512 queries x topk 1,000 with scores made
# a 626 MB answer and 2.7 GiB of server memory. 16,384 covers Search-R1's batched calls (a 512-prompt
# batch at its topk 3 is 1,536 results) with a wide margin and keeps an answer near 20 MB of JSON.
MAX_RESULTS = 16384
LISTEN_BACKLOG = (
    2048  # uvicorn's default; with the old 5, 27 of 64 simultaneous connects waited >1 s (SYN retry)
)
# uvicorn's limit_concurrency: a request that finds this many connections open (its own included) or requests
# in flight gets a 503. Each connection holds at most its body (MAX_BODY_BYTES), the answer being written and
# the next pipelined one (12-16 MiB each at MAX_RESULTS), for at most request_timeout once its writes stall:
# under 1 GiB in all. Uncapped, 32 clients asking for the largest answer held 659 MiB, more clients more.
MAX_CONCURRENCY = 32


class RequestError(Exception):
    """A client error: HTTP status and a message for the ``detail`` field."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_retrieve_request(
    payload: Any, *, default_topk: int, max_results: int = MAX_RESULTS
) -> tuple[list[str], int, bool]:
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
        got = topk if abs(topk) < 10**20 else f"an integer of {len(str(abs(topk)))} digits"
        raise RequestError(bad, f"field 'topk' must be between 1 and {MAX_TOPK}, got {got}")
    if len(queries) * topk > max_results:
        raise RequestError(
            bad,
            f"{len(queries)} queries x topk {topk} = {len(queries) * topk} results; at most {max_results} "
            "results per request (send fewer queries per request or a smaller topk)",
        )
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(
            bad, f"field 'return_scores' must be true or false, got {type(return_scores).__name__}"
        )
    return queries, topk, return_scores


def decode_json_body(raw: bytes) -> Any:
    """Decode a request body or raise a 400 RequestError naming what is wrong."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except RecursionError:  # e.g. 100,000 nested '[': the decoder's recursion guard, not a server fault
        raise RequestError(HTTPStatus.BAD_REQUEST, "request body is JSON nested too deeply") from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit: not a JSONDecodeError
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"request body holds an integer of more than {sys.get_int_max_str_digits()} digits",
        ) from None


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


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return Response(data, status, headers=headers, media_type="application/json; charset=utf-8")


def _error(status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json(status, {"detail": message}, headers)


# A rejected request whose body we did not read: the connection cannot carry a next request.
_CLOSE = {"Connection": "close"}


class _SearchApp:
    """The ASGI app: routing, body limits and the Search-R1 endpoints, with the messages of the API's tests."""

    def __init__(self, server: SearchServer):
        self.server = server

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan is off; nothing else is served
            return
        request = Request(scope, receive)
        try:
            response = await self.handle(request)
        except ClientDisconnect:
            return  # the client hung up mid-body: nobody to answer, nothing to report
        await response(scope, receive, send)

    async def handle(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        method = request.method
        if path not in ("/retrieve", "/health"):
            return _error(
                HTTPStatus.NOT_FOUND,
                f"no such endpoint {request.url.path!r}; use POST /retrieve or GET /health",
                _CLOSE,
            )
        allowed = "POST" if path == "/retrieve" else "GET"
        if method != allowed and not (allowed == "GET" and method == "HEAD"):
            return _error(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{method} is not allowed on {path}; use {allowed}",
                {"Allow": allowed, **_CLOSE},
            )
        srv = self.server
        if path == "/health":
            return _json(
                HTTPStatus.OK,
                {"status": "ok", "retriever": srv.retriever_name, "passages": len(srv.retriever.passages)},
            )
        try:
            raw = await self.read_body(request)
            payload = await run_in_threadpool(decode_json_body, raw)
            queries, topk, return_scores = parse_retrieve_request(
                payload, default_topk=srv.default_topk, max_results=srv.max_results
            )
        except RequestError as exc:
            close = exc.status != HTTPStatus.BAD_REQUEST and exc.status != HTTPStatus.UNPROCESSABLE_ENTITY
            return _error(exc.status, exc.message, _CLOSE if close else None)
        try:
            body = await run_in_threadpool(retrieve_response, srv.retriever, queries, topk, return_scores)
        except Exception as exc:  # a retriever bug must give the client a 500, not a dropped connection
            log.exception("retrieval failed")
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"retrieval failed: {type(exc).__name__}: {exc}")
        return await run_in_threadpool(_json, HTTPStatus.OK, body)

    async def read_body(self, request: Request) -> bytes:
        if "chunked" in request.headers.get("transfer-encoding", "").lower():
            raise RequestError(
                HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not supported; send Content-Length"
            )
        length_header = request.headers.get("content-length")
        if length_header is None:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {length_header!r}") from None
        limit = self.server.max_body_bytes
        if length > limit:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body is {length} bytes; the limit is {limit} bytes",
            )
        try:
            # One deadline for the whole body, not per read: a sender trickling a byte a second is cut off too.
            async with asyncio.timeout(self.server.request_timeout):
                return await request.body()
        except TimeoutError:
            raise RequestError(HTTPStatus.REQUEST_TIMEOUT, "timed out reading the request body") from None


class _HeaderDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on a request's headers and one on stalled writes.

    uvicorn cancels its keep-alive timer on any received byte and has no header timeout, so a client sending a
    header byte now and then would hold its connection forever. The deadline starts when the connection opens
    and again after each response; if the client's next request line and headers are not complete by then, the
    connection is closed (nothing was asked yet, so there is no one to answer).

    Writes: an answer goes to the transport's buffer whole. A client that never reads kept it there past every
    deadline (a keep-alive ``close`` waits for the buffer to drain), with the next pipelined answer waiting
    behind it. When the buffer passes its high-water mark (asyncio calls ``pause_writing``), the
    client has ``header_timeout`` to take it below the low-water mark again; otherwise the connection is aborted
    and both answers are freed.
    """

    header_timeout: float = 60.0  # set per server by SearchServer (a subclass per instance)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        handle = self.loop.call_later(self.header_timeout, self._header_deadline_passed, self.conn)
        self._header_deadline = handle

    def _header_deadline_passed(self, conn: h11.Connection) -> None:
        # IDLE: no complete request head since the deadline was armed (a request in flight is SEND_BODY/DONE).
        if conn is self.conn and conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_deadline = self.loop.call_later(self.header_timeout, self._write_deadline_passed)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel("_write_deadline")

    def _write_deadline_passed(self) -> None:
        if self.transport.get_write_buffer_size():
            # A reset, not a close: the kernel's send queue (up to tcp_wmem's 4 MiB) is freed at once too, rather
            # than trickled out to the stalled client. abort() drops our buffer; connection_lost ends the cycle.
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

    def _cancel(self, name: str) -> None:
        handle = getattr(self, name, None)
        if handle is not None:
            handle.cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel("_header_deadline")
        self._cancel("_write_deadline")
        super().connection_lost(exc)


class SearchServer:
    """The search service bound to one retriever. ``port=0`` picks a free port (see ``server_address``).

    The socket is bound and listening when the constructor returns (so a busy port fails here, and clients that
    connect before ``serve_forever`` wait in the backlog); ``serve_forever`` runs uvicorn in the calling thread
    until ``shutdown`` (from another thread) or Ctrl-C.
    """

    def __init__(
        self,
        retriever: Retriever,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        default_topk: int = DEFAULT_TOPK,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_results: int = MAX_RESULTS,
        retriever_name: str | None = None,
        request_timeout: float = 60.0,
        backlog: int = LISTEN_BACKLOG,
        max_concurrency: int = MAX_CONCURRENCY,
    ):
        if not 1 <= default_topk <= MAX_TOPK:
            raise ValueError(f"default_topk must be between 1 and {MAX_TOPK}, got {default_topk}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {port}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.retriever = retriever
        self.default_topk = default_topk
        self.max_body_bytes = max_body_bytes
        self.max_results = max_results
        self.request_timeout = request_timeout
        self.retriever_name = retriever_name or type(retriever).__name__
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(backlog)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        protocol = type("_Protocol", (_HeaderDeadlineH11,), {"header_timeout": request_timeout})
        config = uvicorn.Config(
            _SearchApp(self),
            http=protocol,
            lifespan="off",
            ws="none",  # plain HTTP only
            backlog=backlog,
            limit_concurrency=max_concurrency,
            log_config=None,  # leave logging to the application (the CLI), as the rest of agentcredit does
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/retrieve"

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop ``serve_forever`` (running in another thread) and wait for it to return."""
        self._uvicorn.should_exit = True
        self._stopped.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()


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
    max_concurrency: int = MAX_CONCURRENCY,
) -> None:
    """Load the corpus, then serve until interrupted (the ``agentcredit serve-search`` command)."""
    retriever = load_retriever(Path(corpus), dense=dense, model_path=model_path)
    server = SearchServer(
        retriever,
        host=host,
        port=port,
        default_topk=topk,
        retriever_name="dense" if dense else "bm25",
        max_concurrency=max_concurrency,
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
