"""``boltrl._http.SyncPool`` (what ``HttpStore`` sends through) against raw socket servers
answering exactly as scripted: framing, keep-alive reuse across threads, a connection
the server closed while idle, garbage, silence and refusal."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from boltrl import _http

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[socket.socket, bytes], bytes | None]
"""Given the connection and one request, the bytes to answer (None: close instead)."""


def _read_request(conn: socket.socket) -> bytes | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


@contextmanager
def _server(handler: Handler) -> Iterator[tuple[str, list[int]]]:
    """A threaded server; yields its URL and a one-item list counting connections."""
    connections = [0]

    class _H(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            connections[0] += 1
            conn: socket.socket = self.request
            while (req := _read_request(conn)) is not None:
                answer = handler(conn, req)
                if answer is None:
                    return
                conn.sendall(answer)

    class _Srv(socketserver.ThreadingTCPServer):
        # socketserver's default listen backlog is 5: eight threads connecting at once
        # under load overflowed it, the dropped SYN waited a 1 s retransmit, and the
        # client's 1 s connect timeout fired
        request_queue_size = 64
        daemon_threads = True

    srv = _Srv(("127.0.0.1", 0), _H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/store", connections
    finally:
        srv.shutdown()
        srv.server_close()


def _ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _pool(url: str, timeout_s: float = 2.0, max_idle: int = 4) -> _http.SyncPool:
    return _http.SyncPool(
        url,
        {"authorization": "Bearer k"},
        timeout_s=timeout_s,
        connect_timeout_s=1,
        max_idle=max_idle,
    )


def test_requests_share_a_connection_and_carry_method_path_headers_body() -> None:
    seen: list[bytes] = []

    def handler(conn: socket.socket, req: bytes) -> bytes:
        seen.append(req)
        if len(seen) == 2:  # chunked, with an extension and a trailer
            return (
                b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n"
                b'3\r\n{"b\r\n4;x=y\r\n":2}\r\n0\r\nx-trailer: 1\r\n\r\n'
            )
        return _ok(b'{"a":1}')

    with _server(handler) as (url, connections):
        pool = _pool(url)
        r = pool.request(
            "POST", "/records", b'{"x":1}', headers={"content-type": "application/json"}
        )
        assert (r.status_code, r.content) == (200, b'{"a":1}')
        assert pool.request("GET", "/count?status=running").content == b'{"b":2}'
        assert pool.request("GET", "/count").status_code == 200
        pool.close()
    assert connections == [1]
    first = seen[0].decode()
    assert first.startswith("POST /store/records HTTP/1.1\r\n")
    assert "authorization: Bearer k\r\n" in first and "content-length: 7\r\n" in first
    assert first.endswith('\r\n\r\n{"x":1}')
    assert seen[1].startswith(b"GET /store/count?status=running HTTP/1.1\r\n")
    assert b"content-length" not in seen[1]


def test_a_connection_the_server_closed_is_replaced_unseen() -> None:
    answered = [0]

    def handler(conn: socket.socket, req: bytes) -> bytes | None:
        answered[0] += 1
        if answered[0] == 1:  # answer as keep-alive, then close without a word
            conn.sendall(_ok(b"{}"))
            return None
        return _ok(b"{}")

    with _server(handler) as (url, connections):
        pool = _pool(url)
        for _ in range(3):
            assert pool.request("GET", "/count").status_code == 200
        pool.close()
    assert connections == [2] and answered == [3]  # the closed one, then one kept alive


def test_threads_share_the_pool() -> None:
    # max_idle as large as the thread count: no connection is ever closed on give-back, so
    # a new one opens only while every existing one is in use, at most 8 in all. (With
    # max_idle 4 the churn depends on scheduling: a loaded CI machine opened 15.)
    with _server(lambda conn, req: _ok(b"{}")) as (url, connections):
        pool = _pool(url, timeout_s=30, max_idle=8)  # 30 s: the test is not about timeouts
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(50):
                    assert pool.request("GET", "/count").status_code == 200
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pool.close()
    assert not errors and 1 <= connections[0] <= 8


@pytest.mark.parametrize(
    "answer, error",
    [
        (b"SSH-2.0-OpenSSH\r\n", _http.ProtocolError),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", _http.TransportError),
        (b"", _http.TransportError),  # silence: the read timeout
    ],
)
def test_garbage_truncation_and_silence_are_transport_errors(
    answer: bytes, error: type[Exception]
) -> None:
    def handler(conn: socket.socket, req: bytes) -> bytes | None:
        if not answer:
            threading.Event().wait(2)
            return None
        conn.sendall(answer)
        if b"short" in answer:
            conn.shutdown(socket.SHUT_WR)
        return None

    with _server(handler) as (url, _):
        with pytest.raises(error):
            _pool(url, timeout_s=0.5).request("GET", "/count")


def test_refused_connection_is_a_transport_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(_http.TransportError, match="cannot connect"):
        _pool(f"http://127.0.0.1:{port}").request("GET", "/count")
    with pytest.raises(ValueError, match="base_url"):
        _pool("ftp://x")
