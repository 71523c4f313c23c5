"""Gateway overhead: added latency over calling the backend directly, and requests/s.

The backend is a ``ScriptedBackend`` (no model, answers in microseconds), so every figure
is the gateway's own cost: HTTP/1.1 keep-alive, parsing and validating the OpenAI body,
calling the backend, recording the ``LLMCall`` (recorded mode: ``--store memory`` or
``sqlite``, two store calls on worker threads), and rendering the response.

The gateway runs in a child process (its own GIL, as in production); the clients run
here, on asyncio, each over one keep-alive connection with a minimal HTTP/1.1 client
(``--client raw``, default: it costs the client side little, so the figures are the
server's) or with httpx (``--client httpx``: what the openai SDK uses).

Request: a 6-message chat (system prompt, a tool, two earlier turns; ~1.9 kB, 2,030
prompt tokens as the scripted backend counts them) answered with 120 characters.

    uv run python benchmarks/gateway_bench.py [--requests N] [--repeat N] [--client raw|httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from boltrl.gateway.backend import GenerationRequest
from boltrl.testing import ScriptedBackend

REPLY = "The forecast for Paris is sunny with a high of 24 degrees. " * 2
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
    {"model": "policy", "messages": MESSAGES, "tools": [TOOL], "temperature": 1.0}
).encode()


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# --------------------------------------------------------------------------- child server


def child(rollouts: int, store_url: str) -> None:
    """The gateway process: a store with ``rollouts`` running rollouts."""
    from boltrl.gateway import Gateway
    from boltrl.records import Task
    from boltrl.store import open_store

    store = open_store(store_url)
    store.enqueue([Task(input={"i": i}) for i in range(rollouts)])
    ids = []
    for _ in range(rollouts):
        attempt = store.claim("bench", lease_s=3600)
        assert attempt is not None
        ids.append(attempt.route)  # the attempt's fenced route, token included
    with Gateway(ScriptedBackend([REPLY]), store) as gw:
        print(json.dumps({"url": gw.url, "rollouts": ids}), flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin
    store.close()


# --------------------------------------------------------------------------- clients

Post = Callable[[], Awaitable[int]]


async def raw_client(url: str, path: str) -> tuple[Post, Callable[[], Awaitable[None]]]:
    """One keep-alive HTTP/1.1 connection; returns (post, close)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\n\r\n"
    ).encode()
    request = head + BODY

    async def post() -> int:
        writer.write(request)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        return int(status_line.split()[1])

    async def close() -> None:
        writer.close()
        await writer.wait_closed()

    return post, close


async def httpx_client(url: str, path: str) -> tuple[Post, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=1))
    headers = {"content-type": "application/json"}

    async def post() -> int:
        r = await client.post(path, content=BODY, headers=headers)
        return r.status_code

    return post, client.aclose


async def load(
    url: str, paths: list[str], concurrency: int, total: int, kind: str
) -> tuple[float, list[float]]:
    """``total`` requests from ``concurrency`` clients; returns (seconds, latencies)."""
    make = raw_client if kind == "raw" else httpx_client
    clients = [await make(url, paths[i % len(paths)]) for i in range(concurrency)]
    for post, _ in clients:  # warm up each connection
        assert await post() == 200
    latencies: list[float] = []
    per = total // concurrency

    async def run(post: Post) -> None:
        for _ in range(per):
            t0 = time.perf_counter()
            status = await post()
            latencies.append(time.perf_counter() - t0)
            assert status == 200, status

    start = time.perf_counter()
    await asyncio.gather(*(run(post) for post, _ in clients))
    elapsed = time.perf_counter() - start
    for _, close in clients:
        await close()
    return elapsed, latencies


async def direct(total: int) -> list[float]:
    """Latencies of ``await backend.generate(...)`` with the same request, in process."""
    backend = ScriptedBackend([REPLY])
    request = GenerationRequest(messages=MESSAGES, tools=[TOOL], temperature=1.0)
    latencies = []
    for _ in range(total):
        t0 = time.perf_counter()
        await backend.generate(request)
        latencies.append(time.perf_counter() - t0)
    return latencies


# --------------------------------------------------------------------------- TransformersBackend
# TransformersBackend tokens/s with dynamic batching vs one request at a time, at 8
# concurrent agents on SmolLM2: measured by benchmarks/backend_bench.py, run from here with
# --transformers (off by default, so this script keeps running without torch).


def transformers_batching(args: argparse.Namespace) -> dict[str, Any] | None:
    """``backend_bench.run`` with its defaults (8 agents x 2 turns x 32 tokens) when asked."""
    if not args.transformers:
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import backend_bench

    bench = argparse.ArgumentParser()
    backend_bench.add_arguments(bench)
    result: dict[str, Any] = backend_bench.run(bench.parse_args(["--repeat", str(args.repeat)]))
    return result


# --------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw")
    p.add_argument("--concurrency", default="1,8,32", help="client counts for requests/s")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each measurement this often, report the best (the machine may be shared)",
    )
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument(
        "--store",
        choices=["memory", "sqlite"],
        default="memory",
        help="store of the recorded route (sqlite: a fresh file in a temporary folder)",
    )
    p.add_argument(
        "--transformers",
        action="store_true",
        help="also measure TransformersBackend batching (needs torch; see backend_bench.py)",
    )
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-store", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args.child, args.child_store)
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    tmp = tempfile.TemporaryDirectory()
    store_url = "memory://" if args.store == "memory" else f"sqlite:///{tmp.name}/bench.db"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(max(levels)), "--child-store", store_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None and proc.stdin is not None
    info = json.loads(proc.stdout.readline())
    url, rollouts = info["url"], info["rollouts"]
    routes = {
        "unrecorded (/v1)": ["/v1/chat/completions"],
        f"recorded (/rollouts/{{id}}/v1, {args.store} store)": [
            f"{r}/v1/chat/completions" for r in rollouts
        ],
    }
    results: dict[str, Any] = {
        "client": args.client,
        "store": args.store,
        "requests": args.requests,
        "repeat": args.repeat,
    }
    try:
        base = min(
            (asyncio.run(direct(args.requests)) for _ in range(args.repeat)),
            key=lambda lat: percentile(lat, 0.5),
        )
        d50, d99 = percentile(base, 0.5), percentile(base, 0.99)
        results["direct_us"] = {"p50": d50 * 1e6, "p99": d99 * 1e6}
        print(f"direct backend.generate: p50 {d50 * 1e6:.0f} µs, p99 {d99 * 1e6:.0f} µs")
        for name, paths in routes.items():
            row: dict[str, Any] = {}
            lat = min(
                (
                    asyncio.run(load(url, paths[:1], 1, args.requests, args.client))[1]
                    for _ in range(args.repeat)
                ),
                key=lambda lat: percentile(lat, 0.5),
            )
            g50, g99 = percentile(lat, 0.5), percentile(lat, 0.99)
            row["added_latency_us"] = {"p50": (g50 - d50) * 1e6, "p99": (g99 - d99) * 1e6}
            print(
                f"{name}: added latency p50 {(g50 - d50) * 1e6:.0f} µs, "
                f"p99 {(g99 - d99) * 1e6:.0f} µs"
            )
            for c in levels:
                elapsed, lat = min(
                    (
                        asyncio.run(load(url, paths, c, args.requests, args.client))
                        for _ in range(args.repeat)
                    ),
                    key=lambda run: run[0],
                )
                rps = len(lat) / elapsed
                row[f"rps_{c}"] = rps
                row[f"p50_ms_{c}"] = percentile(lat, 0.5) * 1e3
                row[f"p99_ms_{c}"] = percentile(lat, 0.99) * 1e3
                print(
                    f"  {c:>2} clients: {rps:7.0f} req/s, p50 {row[f'p50_ms_{c}']:.2f} ms, "
                    f"p99 {row[f'p99_ms_{c}']:.2f} ms"
                )
            results[name] = row
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        tmp.cleanup()
    extra = transformers_batching(args)
    if extra is not None:
        results["transformers_batching"] = extra
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
