"""The Search-R1-compatible HTTP service, exercised with real HTTP requests on an ephemeral localhost port."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.tools.search import BM25Search, format_passages, passage_from_row
from agentcredit.tools.search.server import (
    MAX_RESULTS,
    MAX_TOPK,
    RequestError,
    SearchServer,
    is_loopback,
    parse_retrieve_request,
)

ROWS = [
    {"id": "p0", "title": "Kiss and Tell", "text": "Shirley Temple plays Corliss Archer."},
    {"id": "p1", "title": "Shirley Temple", "text": "Shirley Temple Black was an actress and diplomat."},
    {"id": "p2", "title": "Paris", "text": "Paris is the capital of France."},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SearchServer]:
    passages = [passage_from_row(r, where="t", default_id=r["id"]) for r in ROWS]
    retriever = BM25Search(passages, cache_dir=tmp_path_factory.mktemp("index"))
    srv = SearchServer(
        retriever, host="127.0.0.1", port=0, default_topk=2, max_body_bytes=4096, request_timeout=1.0
    )
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def request(
    srv: SearchServer,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict | None = None,
) -> tuple[int, dict[str, str], Any]:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(payload) if payload else None


def test_retrieve_with_scores_has_search_r1_shape(server: SearchServer) -> None:
    status, headers, body = request(
        server,
        "POST",
        "/retrieve",
        {"queries": ["Corliss Archer", "capital of France"], "topk": 1, "return_scores": True},
    )
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert list(body) == ["result"] and len(body["result"]) == 2
    first = body["result"][0][0]
    assert set(first) == {"document", "score"} and isinstance(first["score"], float)
    assert first["document"] == {
        "id": "p0",
        "title": "Kiss and Tell",
        "text": "Shirley Temple plays Corliss Archer.",
        "contents": '"Kiss and Tell"\nShirley Temple plays Corliss Archer.',
    }
    assert body["result"][1][0]["document"]["id"] == "p2"


def test_retrieve_without_scores_returns_documents(server: SearchServer) -> None:
    status, _, body = request(server, "POST", "/retrieve", {"queries": ["Shirley Temple"]})
    assert status == 200
    docs = body["result"][0]
    assert len(docs) == 2 and {d["id"] for d in docs} == {"p0", "p1"}  # default topk of this server: 2
    assert all(set(d) == {"id", "title", "text", "contents"} for d in docs)


def verl_passages2string(retrieval_result: list[dict]) -> str:
    """verl's search_r1_like_utils._passages2string, restated from its documented behaviour for this check."""
    parts = []
    for i, item in enumerate(retrieval_result, start=1):
        first, _, rest = item["document"]["contents"].partition("\n")
        parts.append(f"Doc {i} (Title: {first})\n{rest}")
    return "\n\n".join(parts).strip()


def test_verl_client_rendering_matches_local_verl_style(server: SearchServer) -> None:
    # What a verl SearchTool pointed at us shows the model equals what our own "verl" style renders locally.
    _, _, body = request(
        server, "POST", "/retrieve", {"queries": ["Shirley Temple actress"], "topk": 2, "return_scores": True}
    )
    local = server.retriever.retrieve("Shirley Temple actress", 2)
    assert verl_passages2string(body["result"][0]) == format_passages(local, "verl")


def test_empty_query_list_and_unmatched_query(server: SearchServer) -> None:
    assert request(server, "POST", "/retrieve", {"queries": []})[2] == {"result": []}
    assert request(server, "POST", "/retrieve", {"queries": ["zebra", ""], "topk": None})[2] == {
        "result": [[], []]
    }


def test_health_and_trailing_slash(server: SearchServer) -> None:
    status, _, body = request(server, "GET", "/health")
    assert status == 200 and body == {"status": "ok", "retriever": "BM25Search", "passages": 3}
    assert request(server, "POST", "/retrieve/", {"queries": ["Paris"], "topk": 1})[0] == 200


@pytest.mark.parametrize(
    ("raw", "status", "detail"),
    [
        (b"{not json", 400, "request body is not valid JSON"),
        (b"\xff\xfe", 400, "not valid UTF-8"),
        (b"[1, 2]", 422, "request body must be a JSON object, got list"),
        (b"{}", 422, "field 'queries' is required"),
        (b'{"queries": "Paris"}', 422, "field 'queries' must be a list of strings, got str"),
        (b'{"queries": ["Paris", 3]}', 422, "field 'queries[1]' must be a string, got int"),
        (b'{"queries": ["Paris"], "topk": "3"}', 422, "field 'topk' must be an integer or null, got str"),
        (b'{"queries": ["Paris"], "topk": true}', 422, "field 'topk' must be an integer or null, got bool"),
        (b'{"queries": ["Paris"], "topk": 0}', 422, f"field 'topk' must be between 1 and {MAX_TOPK}, got 0"),
        (
            b'{"queries": ["Paris"], "return_scores": "yes"}',
            422,
            "field 'return_scores' must be true or false",
        ),
    ],
)
def test_malformed_requests_get_4xx_with_message(
    server: SearchServer, raw: bytes, status: int, detail: str
) -> None:
    got_status, _, body = request(server, "POST", "/retrieve", raw=raw)
    assert got_status == status
    assert detail in body["detail"]


def test_wrong_path_method_size_and_length(server: SearchServer) -> None:
    status, _, body = request(server, "POST", "/search", {"queries": ["x"]})
    assert status == 404 and "POST /retrieve" in body["detail"]
    status, headers, body = request(server, "GET", "/retrieve")
    assert status == 405 and headers["allow"] == "POST" and "use POST" in body["detail"]
    status, headers, _ = request(server, "PUT", "/health", {})
    assert status == 405 and headers["allow"] == "GET"
    status, _, body = request(server, "POST", "/retrieve", raw=b'{"queries": ["' + b"a" * 5000 + b'"]}')
    assert status == 413 and "limit is 4096 bytes" in body["detail"]
    # No Content-Length at all: a raw socket request, since http.client always adds one.
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.putrequest("POST", "/retrieve")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["detail"]
    conn.close()


def test_server_keeps_serving_after_errors_and_under_concurrency(server: SearchServer) -> None:
    request(server, "POST", "/retrieve", raw=b"{bad")
    expected = request(server, "POST", "/retrieve", {"queries": ["Paris"], "topk": 1, "return_scores": True})[
        2
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(
                lambda _: request(
                    server, "POST", "/retrieve", {"queries": ["Paris"], "topk": 1, "return_scores": True}
                ),
                range(32),
            )
        )
    assert all(status == 200 and body == expected for status, _, body in results)


def test_constructor_validation_and_loopback_check() -> None:
    with pytest.raises(ValueError, match="default_topk"):
        SearchServer(object(), port=0, default_topk=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port must be between"):
        SearchServer(object(), port=70000)  # type: ignore[arg-type]
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


def test_cli_help_lists_serve_search() -> None:
    result = CliRunner().invoke(app, ["serve-search", "--help"])
    assert result.exit_code == 0
    assert "--corpus" in result.output and "--port" in result.output and "--dense" in result.output


def test_cli_rejects_missing_corpus_and_model_without_dense(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["serve-search", "--corpus", str(tmp_path / "none.jsonl"), "--port", "0"]
    )
    assert result.exit_code == 2 and "corpus file not found" in result.output
    result = CliRunner().invoke(app, ["serve-search", "--corpus", "x", "--model", str(tmp_path)])
    assert result.exit_code != 0


def test_cli_serves_over_http_end_to_end(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = {**os.environ, "AGENTCREDIT_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentcredit.cli",
            "serve-search",
            "--corpus",
            str(corpus),
            "--port",
            "0",
            "--topk",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/retrieve", line)
        assert match, (
            f"unexpected first line {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        )
        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=10)
        conn.request("POST", "/retrieve", body=json.dumps({"queries": ["capital of France"]}))
        body = json.loads(conn.getresponse().read())
        conn.close()
        assert [d["id"] for d in body["result"][0]] == ["p2"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cli_import_does_not_load_the_search_stack() -> None:
    code = "import sys, agentcredit.cli; print(any(m in sys.modules for m in ('agentcredit.tools.search.server', 'bm25s')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"  # serve-search imports lazily, so `agentcredit --help` stays fast


def test_stalled_body_times_out_with_408(server: SearchServer) -> None:
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"queries"')
        chunks = []
        while chunk := sock.recv(4096):  # the server closes the connection after a 408
            chunks.append(chunk)
        reply = b"".join(chunks).decode()
    assert reply.startswith("HTTP/1.1 408") and "timed out reading the request body" in reply


# ---------------------------------------------------------------------------------------------- limits (issue 34)
def test_results_per_request_are_bounded() -> None:
    # queries x topk, not each alone: 512 x 1,000 with scores was a 626 MB answer from a 13 KB request.
    assert parse_retrieve_request({"queries": ["q"] * 16, "topk": 1000}, default_topk=3)[1] == 1000
    with pytest.raises(RequestError, match=f"17 queries x topk 1000 = 17000 results; at most {MAX_RESULTS}"):
        parse_retrieve_request({"queries": ["q"] * 17, "topk": 1000}, default_topk=3)
    # The default topk counts too.
    with pytest.raises(RequestError, match="3 queries x topk 2 = 6 results; at most 5"):
        parse_retrieve_request({"queries": ["a", "b", "c"]}, default_topk=2, max_results=5)


def test_too_many_results_answered_422_naming_the_limit(server: SearchServer) -> None:
    status, _, body = request(server, "POST", "/retrieve", {"queries": ["Paris"] * 20, "topk": MAX_TOPK})
    assert status == 422
    assert f"at most {MAX_RESULTS} results per request" in body["detail"]
    assert request(server, "GET", "/health")[0] == 200


@contextlib.contextmanager
def serving(srv: SearchServer) -> Iterator[SearchServer]:
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def small_server(tmp_path: Path, **kwargs: Any) -> SearchServer:
    passages = [passage_from_row(r, where="t", default_id=r["id"]) for r in ROWS]
    return SearchServer(
        BM25Search(passages, cache_dir=tmp_path / "index"), host="127.0.0.1", port=0, **kwargs
    )


def test_64_simultaneous_connections_wait_in_the_backlog(tmp_path: Path) -> None:
    # The socket listens from construction; before serving, every connection waits in the kernel's accept queue.
    # With a backlog of 5 the 7th connect's SYN is dropped and retried after 1 s, so a 0.5 s connect times out.
    # the default cap (32) would answer half of them 503; uvicorn counts the asking connection too, hence 65
    srv = small_server(tmp_path, max_concurrency=65)
    host, port = srv.server_address[:2]
    socks = []
    try:
        for _ in range(64):
            sock = socket.create_connection((host, port), timeout=0.5)
            socks.append(sock)
        body = json.dumps({"queries": ["Paris"], "topk": 1}).encode()
        for sock in socks:
            sock.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        with serving(srv):
            for sock in socks:
                sock.settimeout(10)
                reply = b"".join(iter(lambda s=sock: s.recv(65536), b""))
                assert reply.startswith(b"HTTP/1.1 200") and b'"id": "p2"' in reply
    finally:
        for sock in socks:
            sock.close()
        srv.server_close()


def _trickle_until_closed(
    sock: socket.socket, data: bytes, *, every: float, limit: float
) -> tuple[float, bytes]:
    """Send ``data`` a byte at a time until the server closes; returns (seconds taken, what the server sent)."""
    start = time.monotonic()
    sock.setblocking(False)
    received = b""
    for byte in data:
        if time.monotonic() - start > limit:
            break
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
            break
        readable, _, _ = select.select([sock], [], [], every)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return time.monotonic() - start, received


def test_trickled_headers_are_cut_off_by_the_deadline(server: SearchServer) -> None:
    # A byte every 0.2 s never trips a per-read timeout; the request head must still be complete within 1 s
    # (this server's request_timeout), or the connection is closed.
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n"
        took, _ = _trickle_until_closed(sock, head, every=0.2, limit=8.0)
    assert took < 4.0


def test_trickled_body_gets_408_within_the_deadline(server: SearchServer) -> None:
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
        took, reply = _trickle_until_closed(sock, b'{"queries": ["' + b"a" * 200, every=0.2, limit=8.0)
    assert took < 4.0
    assert reply.startswith(b"HTTP/1.1 408") and b"timed out reading the request body" in reply


def test_slow_senders_hold_no_threads(tmp_path: Path) -> None:
    # 200 slow senders held 200 threads (a thread per connection, 60 s per read). The default 60 s deadline
    # here, so no connection is released by a timeout while we count.
    with serving(small_server(tmp_path)) as srv:
        before = threading.active_count()
        socks = [socket.create_connection(srv.server_address[:2], timeout=30) for _ in range(100)]
        try:
            for sock in socks:
                sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.3)
            assert threading.active_count() - before < 10  # a thread per connection would add 100
            start = time.monotonic()
            assert request(srv, "GET", "/health")[0] == 200
            assert time.monotonic() - start < 2.0
        finally:
            for sock in socks:
                sock.close()


def test_deeply_nested_json_is_a_400_and_the_server_lives_on(tmp_path: Path) -> None:
    with serving(small_server(tmp_path)) as srv:  # the default 1 MiB body limit
        status, _, body = request(srv, "POST", "/retrieve", raw=b"[" * 100_000 + b"]" * 100_000)
        assert status == 400 and body["detail"] == "request body is JSON nested too deeply"
        status, _, body = request(srv, "POST", "/retrieve", raw=b'{"queries": ' + b"[" * 100_000)
        assert status == 400
        assert request(srv, "GET", "/health")[0] == 200


def _hang_up(port: int, data: bytes, *, reset: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if reset:  # close with RST, as a killed client does, so the server's write fails
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(data)
    sock.close()


def test_clients_that_hang_up_leave_no_traceback(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    rows = [{**r, "id": f"{r['id']}-{i}"} for i in range(50) for r in ROWS]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcredit.cli", "serve-search", "--corpus", str(corpus), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTCREDIT_HOME": str(tmp_path / "home")},
    )
    try:
        assert proc.stdout is not None
        match = re.search(r":(\d+)/retrieve", proc.stdout.readline())
        assert match
        port = int(match.group(1))
        body = json.dumps({"queries": ["Shirley Temple"] * 50, "topk": 100, "return_scores": True}).encode()
        full = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        for _ in range(5):
            _hang_up(port, full, reset=True)  # gone before the answer is written
            _hang_up(port, full[: len(full) - 10], reset=True)  # gone mid-body
            _hang_up(port, full[:20], reset=False)  # gone mid-headers
            _hang_up(port, full, reset=False)
        time.sleep(1.0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/retrieve", body=json.dumps({"queries": ["capital of France"], "topk": 1}))
        assert json.loads(conn.getresponse().read())["result"][0][0]["title"] == "Paris"
        conn.close()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=20)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr


# ------------------------------------------------------------------------------------------ limits (issue 52)
@pytest.mark.parametrize(
    ("field", "number"),
    [("topk", b"1" * 5000), ("return_scores", b"9" * 5000), ("topk", b"-" + b"7" * 4400)],
)
def test_a_number_of_thousands_of_digits_is_a_400_not_a_500(
    tmp_path: Path, field: str, number: bytes
) -> None:
    # json.loads raises a plain ValueError past 4,300 digits (not a JSONDecodeError): it was a 500 with a traceback.
    with serving(small_server(tmp_path)) as srv:
        raw = b'{"queries": ["Paris"], "%s": %s}' % (field.encode(), number)
        status, _, body = request(srv, "POST", "/retrieve", raw=raw)
        assert status == 400 and "more than 4300 digits" in body["detail"], body
        status, _, body = request(srv, "POST", "/retrieve", raw=b'{"queries": ["Paris"], "topk": 1%s}' % (
            b"0" * 4000))  # fmt: skip
        assert status == 422 and "got an integer of 4001 digits" in body["detail"]  # not 4,001 digits of echo
        with socket.create_connection(
            srv.server_address[:2], timeout=10
        ) as sock:  # the one number in a header
            sock.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: " + number.lstrip(b"-") + b"\r\n\r\n"
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 400")  # h11's own refusal
        assert request(srv, "GET", "/health")[0] == 200


def test_concurrency_is_capped_with_a_503(tmp_path: Path) -> None:
    # Concurrency was uncapped: 32 clients asking for the largest answer at once held 659 MiB. uvicorn's own
    # limit_concurrency caps connections and requests in flight together.
    with serving(small_server(tmp_path, max_concurrency=2)) as srv:
        held = [socket.create_connection(srv.server_address[:2], timeout=10) for _ in range(2)]
        try:
            time.sleep(0.2)  # both accepted
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 503  # uvicorn's own answer, in plain text
            conn.close()
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.3)
        assert request(srv, "GET", "/health")[0] == 200


def test_an_answer_nobody_reads_is_dropped_at_the_deadline(tmp_path: Path) -> None:
    # A client that asks for a large answer and never reads it held the answer in the server's memory past every
    # deadline (uvicorn's keep-alive close waits for the buffer to drain). It is now aborted request_timeout after
    # the server's writes stalled: the client then gets the connection reset or cut short, not the whole answer.
    text = "Paris " + "x" * 2000
    rows = [{"id": f"p{i}", "title": "Paris", "text": text} for i in range(400)]
    passages = [passage_from_row(r, where="t", default_id=r["id"]) for r in rows]
    srv = SearchServer(
        BM25Search(passages, cache_dir=tmp_path / "index"), host="127.0.0.1", port=0, request_timeout=1.0
    )
    with serving(srv):
        body = json.dumps(
            {"queries": ["Paris"] * 10, "topk": 400}
        ).encode()  # ~8.5 MB: past the kernel's 4 MB
        with socket.create_connection(srv.server_address[:2], timeout=60) as sock:
            sock.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            select.select(
                [sock], [], [], 60
            )  # the answer has started to arrive: the server's writes stall now
            time.sleep(3.0)  # the deadline is 1 s
            received = b""
            try:
                while chunk := sock.recv(1 << 20):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
    head, _, answer = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
    assert length > 8_000_000 and len(answer) < length  # the whole answer never came
