"""The load generator of the proxy workload: keep-alive HTTP/1.1 clients on asyncio,
minimal so that the client side costs little (the figures are the servers'), the same
clients for every target. Reads ``Content-Length`` and chunked bodies."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
MESSAGES = [
    {"role": "system", "content": "You are a helpful travel assistant. " * 20},
    {"role": "user", "content": "I am planning a trip to Paris next week. " * 6},
    {"role": "assistant", "content": "Happy to help! What would you like to know? " * 4},
    {"role": "user", "content": "What will the weather be like? Any packing tips? " * 4},
    {"role": "assistant", "content": "Let me check the forecast for you first. " * 4},
    {"role": "user", "content": "Thanks, please be specific about the temperatures. " * 4},
]
BODY = json.dumps(
    {"model": "scripted", "messages": MESSAGES, "tools": [TOOL], "temperature": 1.0}
).encode()
"""A 6-message chat with one tool (~1.9 kB); the upstream answers it with text."""


class Conn:
    """One keep-alive connection posting ``BODY`` to one path."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes):
        self.reader, self.writer, self.request = reader, writer, head + BODY

    @classmethod
    async def open(cls, base: str, path: str) -> Conn:
        url = urlsplit(base)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        head = (
            f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nhost: {url.netloc}\r\n"
            f"content-type: application/json\r\nauthorization: Bearer bench\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode()
        return cls(reader, writer, head)

    async def post(self) -> int:
        self.writer.write(self.request)
        status = int((await self.reader.readline()).split()[1])
        length, chunked = 0, False
        while (line := await self.reader.readline()) != b"\r\n":
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            await self.reader.readexactly(length)
            return status
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            await self.reader.readexactly(size + 2)
        while await self.reader.readline() != b"\r\n":  # trailers
            pass
        return status

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def _load(base: str, paths: list[str], clients: int, total: int) -> tuple[float, list[float]]:
    conns = [await Conn.open(base, paths[i % len(paths)]) for i in range(clients)]
    for c in conns:  # connect and warm each route before the clock starts
        status = await c.post()
        if status != 200:
            raise RuntimeError(f"{base}{paths[0]} answered {status}")
    latencies: list[float] = []

    async def run(c: Conn) -> None:
        for _ in range(total // clients):
            t0 = time.perf_counter()
            status = await c.post()
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"{base} answered {status}")

    t0 = time.perf_counter()
    await asyncio.gather(*(run(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for c in conns:
        await c.close()
    return elapsed, latencies


def load(base: str, paths: list[str], clients: int, total: int) -> tuple[float, list[float]]:
    """``total`` requests from ``clients`` connections (connection i posts to
    ``paths[i % len(paths)]``); returns (seconds, latencies in seconds)."""
    return asyncio.run(_load(base, paths, clients, total))
