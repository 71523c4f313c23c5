"""The gateway's HTTP/1.1 client for upstream servers, against raw asyncio servers that
answer exactly as scripted: framing (length, chunked, until close), keep-alive reuse,
connections the server closed, garbage, silence and refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from boltrl import _http
from boltrl.gateway.upstream import UpstreamBackend

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


def _ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _with_server(handler: Handler, test: Callable[[_http.Pool], Awaitable[None]]) -> int:
    """Run ``test`` against a server answering with ``handler``; returns its connections."""
    connections = 0

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = _http.Pool(
        f"http://127.0.0.1:{port}/v1",
        {"authorization": "Bearer k"},
        timeout_s=0.5,
        connect_timeout_s=0.5,
        max_connections=4,
        max_idle=4,
    )
    try:
        await test(pool)
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
    return connections


def test_length_and_chunked_answers_share_one_connection() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        writer.write(_ok(b'{"a":1}'))
        seen.append(await _read_request(reader))
        chunked = b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(chunked + b'3\r\n{"b\r\n4;x=y\r\n":2}\r\n0\r\nx-trailer: 1\r\n\r\n')
        await reader.read()

    async def test(pool: _http.Pool) -> None:
        first = await pool.post_json("/chat/completions", b'{"q":1}')
        second = await pool.post_json("/chat/completions", b'{"q":2}')
        assert (first.status_code, first.content) == (200, b'{"a":1}')
        assert (second.status_code, second.content) == (201, b'{"b":2}')

    assert asyncio.run(_with_server(handler, test)) == 1
    assert seen == [b'{"q":1}', b'{"q":2}']


@pytest.mark.parametrize("pause_s", [0.0, 0.05])
def test_connections_the_server_closes_are_not_reused(pause_s: float) -> None:
    """Closed while idle (seen before reuse) or just before the next request (that request
    fails unanswered and goes out again on a fresh connection)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(b"1"))
        await writer.drain()  # then close: an idle keep-alive connection the server dropped

    async def test(pool: _http.Pool) -> None:
        for _ in range(3):
            assert (await pool.post_json("/x", b"{}")).content == b"1"
            await asyncio.sleep(pause_s)

    assert asyncio.run(_with_server(handler, test)) == 3


def test_connection_close_and_unframed_answers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async def test(pool: _http.Pool) -> None:
        for _ in range(2):
            assert (await pool.post_json("/x", b"{}")).content == b"until the end"

    assert asyncio.run(_with_server(handler, test)) == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SSH-2.0-OpenSSH\r\n", _http.ProtocolError),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", _http.TransportError),
        (None, _http.TransportError),  # silence: the total timeout
    ],
)
def test_bad_answers_raise(answer: bytes | None, error: type[Exception]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if answer is None:
            await asyncio.sleep(2)
        else:
            writer.write(answer)
            await writer.drain()

    async def test(pool: _http.Pool) -> None:
        with pytest.raises(error):
            await pool.post_json("/x", b"{}")

    asyncio.run(_with_server(handler, test))


def test_refused_connection_raises() -> None:
    async def test() -> None:
        pool = _http.Pool(
            "http://127.0.0.1:9/v1",
            {},
            timeout_s=1,
            connect_timeout_s=1,
            max_connections=1,
            max_idle=1,
        )
        with pytest.raises(_http.TransportError, match="cannot connect"):
            await pool.post_json("/x", b"{}")

    asyncio.run(test())


def test_a_proxy_in_the_environment_is_honored_through_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert UpstreamBackend("http://vllm:8000/v1", "m")._via_httpx
    assert not UpstreamBackend("http://localhost:8000/v1", "m")._via_httpx
    assert not UpstreamBackend("https://vllm:8000/v1", "m")._via_httpx
