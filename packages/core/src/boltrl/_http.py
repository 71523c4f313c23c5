"""A small HTTP/1.1 client on keep-alive connections: ``Pool`` for asyncio callers (the
gateway's ``UpstreamBackend``), ``SyncPool`` for threads (``HttpStore``).

Both sit on hot paths: every call the gateway serves from an upstream costs one request
to it, and every store operation of a remote runner one request to the store. httpx
spends about 1 ms of CPU per request on a 2-core machine (its request/response models,
header handling and the anyio layers under httpcore) where this client spends about
0.15 ms. It does what those two callers need and no more: GET/POST, ``Content-Length``,
chunked or close-delimited answers, keep-alive reuse (a connection the server closed
while idle is replaced without the caller seeing it), TLS, a connect and a read timeout.
It honors no proxy settings: ``UpstreamBackend`` falls back to httpx when the
environment names a proxy for its upstream.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_MAX_LINE = 65536


class TransportError(Exception):
    """The request could not be sent or its answer not read (refused, reset, timed out,
    or not HTTP)."""


class ProtocolError(TransportError):
    """The server answered something that is not an HTTP/1.1 response."""


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


@dataclass(frozen=True)
class _Head:
    status: int
    keep: bool
    """Whether the connection may carry another request after this answer."""
    length: int | None
    chunked: bool

    @property
    def bodiless(self) -> bool:
        return self.status in (204, 304) or 100 <= self.status < 200


def _status(line: bytes) -> tuple[int, bool]:
    version, _, rest = line.partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ValueError(f"status line {line[:80]!r}")
    return int(rest[:3]), version == b"HTTP/1.1"


def _header(head: _Head, line: bytes) -> _Head:
    """``head`` updated by one header line."""
    name, _, value = line.partition(b":")
    name = name.strip().lower()
    if name == b"content-length":
        return _Head(head.status, head.keep, int(value), head.chunked)
    if name == b"transfer-encoding":
        return _Head(head.status, head.keep, head.length, b"chunked" in value.lower())
    if name == b"connection":
        v = value.lower()
        keep = b"close" not in v and (head.keep or b"keep-alive" in v)
        return _Head(head.status, keep, head.length, head.chunked)
    return head


class _Target:
    """Where requests go and the header lines every one of them carries."""

    def __init__(self, base_url: str, headers: dict[str, str], user_agent: str) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url: expected http(s)://host[:port]/path, got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        netloc = url.netloc.rpartition("@")[2]
        lines = [f"host: {netloc}", f"user-agent: {user_agent}", "accept: application/json"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.head = "\r\n".join(lines)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> bytes:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if body is None and method == "GET":
            return f"{method} {self.prefix}{path} HTTP/1.1\r\n{self.head}\r\n{extra}\r\n".encode()
        body = body or b""
        return (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n{self.head}\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body


class _Stale(Exception):
    """A reused keep-alive connection failed before any answer: retry on a fresh one."""


# -- asyncio -------------------------------------------------------------------------------


class Pool:
    """Keep-alive connections to one server, for one event loop (asyncio streams belong
    to the loop that opened them). At most ``max_connections`` requests at a time."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        max_idle: int,
        user_agent: str = "boltrl-gateway",
    ) -> None:
        self._target = _Target(base_url, headers, user_agent)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Conn] = []
        self._max_idle = max_idle

    async def post_json(self, path: str, body: bytes) -> Response:
        """POST ``body`` (JSON) to the base URL's path + ``path``; the whole answer."""
        request = self._target.request("POST", path, body, {"content-type": "application/json"})
        async with self._slots:
            try:
                return await asyncio.wait_for(self._send(request), self._timeout_s)
            except TimeoutError as e:
                raise TransportError(f"no answer within {self._timeout_s:g} s") from e

    async def _send(self, request: bytes) -> Response:
        while self._idle:
            conn = self._idle.pop()
            if conn[0].at_eof() or conn[1].is_closing():  # the server closed it while idle
                conn[1].close()
                continue
            try:
                return await self._exchange(conn, request)
            except _Stale:
                conn[1].close()  # closed under us before answering anything: a fresh one
        return await self._exchange(await self._connect(), request, fresh=True)

    async def _connect(self) -> _Conn:
        t = self._target
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(t.host, t.port, ssl=t.ssl), self._connect_timeout_s
            )
        except TimeoutError as e:
            raise TransportError(f"connect timed out after {self._connect_timeout_s:g} s") from e
        except OSError as e:
            raise TransportError(f"cannot connect: {e}") from e

    async def _exchange(self, conn: _Conn, request: bytes, *, fresh: bool = False) -> Response:
        reader, writer = conn
        answered = False
        try:
            writer.write(request)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionResetError("connection closed before an answer")
            answered = True
            response, keep = await _read_response(reader, status_line)
        except BaseException as e:
            writer.close()
            if isinstance(e, OSError | asyncio.IncompleteReadError) and not answered and not fresh:
                raise _Stale from e
            if isinstance(e, OSError | asyncio.IncompleteReadError):
                raise TransportError(f"connection failed: {e!r}") from e
            if isinstance(e, ValueError | asyncio.LimitOverrunError):
                raise ProtocolError(f"not an HTTP/1.1 answer: {e}") from e
            raise
        if keep and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            writer.close()
        return response

    def close(self) -> None:
        """Close the idle connections (call it on the pool's loop or after it stopped)."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


async def _read_response(reader: asyncio.StreamReader, status_line: bytes) -> tuple[Response, bool]:
    """The answer after its status line, and whether the connection may be reused."""
    status, keep = _status(status_line)
    head = _Head(status, keep, None, False)
    while (line := await reader.readline()) not in (b"\r\n", b"\n"):
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        head = _header(head, line)
    if head.bodiless:
        return Response(status, b""), head.keep
    if head.chunked:
        parts = []
        while size := int((await reader.readline()).split(b";")[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return Response(status, b"".join(parts)), head.keep
    if head.length is not None:
        return Response(status, await reader.readexactly(head.length)), head.keep
    return Response(status, await reader.read()), False  # delimited by closing


# -- threads -------------------------------------------------------------------------------


class _SyncConn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rb", buffering=_MAX_LINE)

    def closed_by_peer(self) -> bool:
        """Readable while idle means the server closed it (or sent what nobody asked)."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class SyncPool:
    """Keep-alive connections to one server, for blocking callers on any thread.

    Thread-safe: each request takes an idle connection (or opens one) for its duration
    and gives it back. ``timeout_s`` bounds connecting and each wait for the answer's
    bytes. Connections above ``max_idle`` are closed when given back.
    """

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_idle: int,
        user_agent: str = "boltrl",
    ) -> None:
        self._target = _Target(base_url, headers, user_agent)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_SyncConn] = []
        self._closed = False

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        """Send one request to the base URL's path + ``path``; the whole answer.

        Raises ``TransportError`` (``ProtocolError`` for a non-HTTP answer).
        """
        request = self._target.request(method, path, body, headers)
        timeout = self._timeout_s if timeout_s is None else timeout_s
        while (conn := self._take()) is not None:
            try:
                return self._exchange(conn, request, timeout)
            except _Stale:
                conn.close()  # closed under us before answering anything: a fresh one
        return self._exchange(self._connect(), request, timeout, fresh=True)

    def _take(self) -> _SyncConn | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed_by_peer():
                    return conn
                conn.close()
        return None

    def _give_back(self, conn: _SyncConn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> _SyncConn:
        t = self._target
        try:
            sock = socket.create_connection((t.host, t.port), self._connect_timeout_s)
        except TimeoutError as e:
            raise TransportError(f"connect timed out after {self._connect_timeout_s:g} s") from e
        except OSError as e:
            raise TransportError(f"cannot connect: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if t.ssl is not None:
            try:
                sock = t.ssl.wrap_socket(sock, server_hostname=t.host)
            except OSError as e:
                sock.close()
                raise TransportError(f"TLS handshake failed: {e}") from e
        return _SyncConn(sock)

    def _exchange(
        self, conn: _SyncConn, request: bytes, timeout: float, *, fresh: bool = False
    ) -> Response:
        answered = False
        try:
            conn.sock.settimeout(timeout)
            conn.sock.sendall(request)
            status_line = conn.file.readline(_MAX_LINE)
            if not status_line:
                raise ConnectionResetError("connection closed before an answer")
            answered = True
            response, keep = _read_sync(conn.file, status_line)
        except BaseException as e:
            conn.close()
            if isinstance(e, TimeoutError):
                raise TransportError(f"no answer within {timeout:g} s") from e
            if isinstance(e, OSError | EOFError) and not answered and not fresh:
                raise _Stale from e
            if isinstance(e, OSError | EOFError):
                raise TransportError(f"connection failed: {e!r}") from e
            if isinstance(e, ValueError):
                raise ProtocolError(f"not an HTTP/1.1 answer: {e}") from e
            raise
        if keep:
            self._give_back(conn)
        else:
            conn.close()
        return response

    def close(self) -> None:
        """Close the idle connections; requests in flight close theirs when done."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Reader(Protocol):
    """What ``_read_sync`` reads from (a socket's binary file)."""

    def read(self, n: int = -1, /) -> bytes: ...
    def readline(self, limit: int = -1, /) -> bytes: ...


def _exactly(file: _Reader, n: int) -> bytes:
    data = file.read(n)
    if len(data) != n:
        raise EOFError(f"connection closed after {len(data)} of {n} bytes")
    return data


def _line(file: _Reader) -> bytes:
    line = file.readline(_MAX_LINE)
    if line.endswith(b"\n"):
        return line
    if len(line) >= _MAX_LINE:
        raise ValueError("line too long")
    raise EOFError("connection closed mid-line")


def _read_sync(file: _Reader, status_line: bytes) -> tuple[Response, bool]:
    """``_read_response`` for a blocking file."""
    status, keep = _status(status_line)
    head = _Head(status, keep, None, False)
    while (line := _line(file)) not in (b"\r\n", b"\n"):
        head = _header(head, line)
    if head.bodiless:
        return Response(status, b""), head.keep
    if head.chunked:
        parts = []
        while size := int(_line(file).split(b";")[0], 16):
            parts.append(_exactly(file, size))
            _exactly(file, 2)
        while _line(file) not in (b"\r\n", b"\n"):  # trailers
            pass
        return Response(status, b"".join(parts)), head.keep
    if head.length is not None:
        return Response(status, _exactly(file, head.length)), head.keep
    return Response(status, file.read()), False  # delimited by closing
