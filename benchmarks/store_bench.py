"""Store throughput: records/s ingested and claim→finish cycles/s.

Measures the memory store, the SQLite store in process, and the SQLite store served
over HTTP by ``boltrl store serve`` in a separate process, each with N concurrent
clients (threads). ``http`` gives each thread its own client, like separate runner
processes; ``http-shared`` has the threads share one client, like the slots of one
``Runner`` (concurrent ``record`` calls then travel in shared batches).

    uv run python benchmarks/store_bench.py --clients 1,8
    uv run python benchmarks/store_bench.py --client-cpu   # HttpStore's transport vs httpx

Records are ``LLMCall``s shaped like real ones (``--tokens`` prompt ids, a quarter of
that in response ids and logprobs), written ``--batch`` per ``record()`` call.
Not a test: numbers depend on the machine; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from boltrl.records import LLMCall, Task
from boltrl.store import HttpStore, MemoryStore, SqliteStore, Store


def _served(path: Path) -> tuple[subprocess.Popen[str], str]:
    cli = "import sys; from boltrl.cli import main; sys.exit(main())"
    proc = subprocess.Popen(
        [sys.executable, "-c", cli, "store", "serve", "--db", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


class Target:
    """One store under test: a fresh store per measurement, one handle per client."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self._n = 0
        self._server: subprocess.Popen[str] | None = None
        self._owner: Store | None = None
        self._url = ""

    def open(self) -> None:
        self._n += 1
        path = self.tmp / f"{self.kind}-{self._n}.db"
        if self.kind == "memory":
            self._owner = MemoryStore()
        elif self.kind == "sqlite":
            self._owner = SqliteStore(path)
        else:
            self._server, self._url = _served(path)
            if self.kind == "http-shared":
                self._owner = HttpStore(self._url)

    def client(self) -> Store:
        if self._owner is not None:
            return self._owner
        return HttpStore(self._url)

    def close(self, clients: list[Store]) -> None:
        for c in {id(c): c for c in clients}.values():
            c.close()
        if self._owner is not None:
            self._owner.close()
            self._owner = None
        if self._server is not None:
            self._server.terminate()
            self._server.wait(10)
            self._server = None


def _in_threads(n: int, fn: Callable[[int], None]) -> float:
    """Run fn(0..n-1) in n threads started together; wall seconds until all finish."""
    start = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            fn(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def bench_ingest(target: Target, clients: int, n_records: int, batch: int, tokens: int) -> float:
    target.open()
    handles = [target.client() for _ in range(clients)]
    try:
        handles[0].enqueue([Task(input={"c": c}) for c in range(clients)])
        attempts = []
        for h in handles:
            att = h.claim("bench", lease_s=600)
            assert att is not None
            attempts.append(att)
        per_client = n_records // clients
        prompt = list(range(tokens))
        reply = list(range(tokens // 4))
        logprobs = [-0.5] * (tokens // 4)
        # Built before the clock starts: the figure is the store's, not pydantic's.
        batches = [
            [
                [
                    LLMCall(
                        id=f"call-{c}-{k}",
                        rollout_id=att.rollout_id,
                        attempt=att.number,
                        request={"messages": [{"role": "user", "content": "hi"}]},
                        response={"message": {"role": "assistant", "content": "ok"}},
                        prompt_token_ids=prompt,
                        response_token_ids=reply,
                        response_logprobs=logprobs,
                    )
                    for k in range(start, min(start + batch, per_client))
                ]
                for start in range(0, per_client, batch)
            ]
            for c, att in enumerate(attempts)
        ]

        def write(c: int) -> None:
            for records in batches[c]:
                handles[c].record(attempts[c], records)

        secs = _in_threads(clients, write)
        return per_client * clients / secs
    finally:
        target.close(handles)


def bench_cycles(target: Target, clients: int, n_rollouts: int) -> float:
    target.open()
    handles = [target.client() for _ in range(clients)]
    try:
        handles[0].enqueue([Task(input={"i": i}) for i in range(n_rollouts)])
        done = [0] * clients

        def cycle(c: int) -> None:
            h = handles[c]
            while (att := h.claim(f"w{c}", lease_s=600)) is not None:
                h.finish(att, "succeeded", reward=1.0)
                done[c] += 1

        secs = _in_threads(clients, cycle)
        assert sum(done) == n_rollouts
        return n_rollouts / secs
    finally:
        target.close(handles)


def client_cpu(n: int = 2000) -> None:
    """Client CPU per request, one thread: httpx.Client vs ``boltrl._http.SyncPool`` (what
    ``HttpStore`` sends through) against one ``boltrl store serve --db memory://``."""
    import resource

    import httpx
    from pydantic import TypeAdapter

    from boltrl import _http

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    proc, url = _served_memory()
    try:
        with HttpStore(url) as s:
            [rid] = s.enqueue([Task(input={})])
            att = s.claim("w")
            assert att is not None
        call = LLMCall(
            id="x",
            rollout_id=rid,
            attempt=1,
            prompt_token_ids=list(range(256)),
            response_token_ids=list(range(64)),
            response_logprobs=[-0.5] * 64,
        )
        bare = att.model_copy(update={"task": None}).model_dump_json().encode()
        records = TypeAdapter(list[LLMCall]).dump_json([call])
        body = b'{"items":[{"attempt":' + bare + b',"records":' + records + b"}]}"
        json_type = {"content-type": "application/json"}
        hx = httpx.Client(base_url=url + "/store")
        pool = _http.SyncPool(url + "/store", {}, timeout_s=30, connect_timeout_s=10, max_idle=4)

        def via_httpx(method: str, path: str, b: bytes | None) -> int:
            return hx.request(method, path, content=b, headers=json_type).status_code

        def via_pool(method: str, path: str, b: bytes | None) -> int:
            return pool.request(method, path, b, headers=json_type).status_code

        print(f"{'client':<9} {'request':<20} {'CPU us':>7} {'wall us':>8}")
        for rnd in range(2):  # the first round warms both up
            for name, fn in (("httpx", via_httpx), ("SyncPool", via_pool)):
                for method, path, b in (("GET", "/count", None), ("POST", "/records", body)):
                    assert fn(method, path, b) == 200
                    c0, t0 = cpu(), time.perf_counter()
                    for _ in range(n):
                        fn(method, path, b)
                    c1, t1 = cpu(), time.perf_counter()
                    if rnd:
                        us_cpu, us_wall = 1e6 * (c1 - c0) / n, 1e6 * (t1 - t0) / n
                        print(f"{name:<9} {method + ' ' + path:<20} {us_cpu:>7.0f} {us_wall:>8.0f}")
        hx.close()
        pool.close()
    finally:
        proc.terminate()
        proc.wait()


def _served_memory() -> tuple[subprocess.Popen[str], str]:
    cli = "import sys; from boltrl.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", cli, "store", "serve", "--db", "memory://", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--stores",
        default="memory,sqlite,http,http-shared",
        help="comma-separated: memory, sqlite, http, http-shared",
    )
    p.add_argument("--clients", default="1,8", help="comma-separated client counts")
    p.add_argument("--records", type=int, default=20_000, help="records to ingest per run")
    p.add_argument("--batch", type=int, default=10, help="records per record() call")
    p.add_argument("--tokens", type=int, default=256, help="prompt token ids per LLMCall")
    p.add_argument("--rollouts", type=int, default=5_000, help="claim→finish cycles per run")
    p.add_argument("--repeat", type=int, default=1, help="report the best of this many runs")
    p.add_argument(
        "--http-scale", type=float, default=0.2, help="fraction of the sizes used over HTTP"
    )
    p.add_argument("--client-cpu", action="store_true", help="only compare client CPU per request")
    args = p.parse_args()
    if args.client_cpu:
        client_cpu()
        return
    kinds = [k for k in args.stores.split(",") if k]
    counts = [int(c) for c in args.clients.split(",") if c]
    print(
        f"records: LLMCall with {args.tokens} prompt ids, batch {args.batch}; "
        f"sizes: {args.records} records, {args.rollouts} cycles (HTTP x{args.http_scale}); "
        f"best of {args.repeat}"
    )
    print(f"{'store':<12} {'clients':>7} {'records/s':>12} {'cycles/s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            scale = args.http_scale if kind.startswith("http") else 1.0
            target = Target(kind, Path(tmp))
            for n in counts:
                recs = max(
                    bench_ingest(
                        target, n, max(n, int(args.records * scale)), args.batch, args.tokens
                    )
                    for _ in range(args.repeat)
                )
                cyc = max(
                    bench_cycles(target, n, max(n, int(args.rollouts * scale)))
                    for _ in range(args.repeat)
                )
                print(f"{kind:<12} {n:>7} {recs:>12,.0f} {cyc:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
