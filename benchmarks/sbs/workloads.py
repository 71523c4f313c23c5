"""The four side-by-side workloads, driven from ``benchmarks/run.py``.

Every workload runs both sides in the same invocation, in rounds whose order alternates
(boltrl first, then the peer; then the other way round), and reports each side's median
over rounds and the median of the per-round ratios boltrl / peer: pairing rounds cancels
most of a shared machine's load swings. Without the peer (``peer_py`` None) only boltrl's
column is filled.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import loadgen
from procs import PEER_ENV, Proc, side_argv
from wire import JSON, median, percentile, rss_mb


@dataclass(frozen=True)
class Sizes:
    rounds: int
    capture_pairs: int
    """Captured runs per side per round (boltrl also runs as many bare runs)."""
    proxy_requests: dict[int, int]
    """Requests per measurement, by concurrent clients."""
    store_rollouts: int
    store_http_rollouts: int
    store_rounds: int
    convert_rollouts: int
    convert_sources: int
    """Rollouts really captured for the conversion workload (the rest are copies)."""
    convert_repeat: int

    def describe(self) -> str:
        proxy = ", ".join(f"{n} requests at {c}" for c, n in self.proxy_requests.items())
        return (
            f"{self.rounds} paired rounds; capture {self.capture_pairs} runs per side per "
            f"round; proxy {proxy}; store {self.store_rollouts:,} rollouts in process, "
            f"{self.store_http_rollouts:,} over HTTP, {STORE['workers']} workers, "
            f"{self.store_rounds} round(s); convert {self.convert_rollouts:,} rollouts "
            f"(copies of {self.convert_sources} captured ones), median of {self.convert_repeat}"
        )


FULL = Sizes(
    rounds=5,
    capture_pairs=10,
    proxy_requests={1: 200, 8: 240, 32: 320},
    store_rollouts=10_000,
    store_http_rollouts=2_000,
    store_rounds=1,
    convert_rollouts=1_000,
    convert_sources=10,
    convert_repeat=3,
)
QUICK = Sizes(
    rounds=1,
    capture_pairs=3,
    proxy_requests={1: 30, 8: 48, 32: 64},
    store_rollouts=200,
    store_http_rollouts=100,
    store_rounds=1,
    convert_rollouts=50,
    convert_sources=2,
    convert_repeat=1,
)

STORE = {"workers": 8, "records": 10, "tokens": 256}
"""Workload 3: concurrent workers, spans/calls recorded per rollout, prompt ids per call."""


@dataclass
class Row:
    workload: str
    measure: str
    unit: str
    better: str
    """``lower`` or ``higher``."""
    boltrl: float
    peer: float | None = None
    ratio: float | None = None
    """boltrl / peer: the median of the per-round ratios (pooled figures for p99s)."""

    @property
    def ahead(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio < 1 if self.better == "lower" else self.ratio > 1


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    """What each side recorded, the upstream's own figures, ...: printed under the table."""


def paired(b: Sequence[float], p: Sequence[float]) -> float:
    return median([x / y for x, y in zip(b, p, strict=True)])


def compare(
    workload: str, measure: str, unit: str, better: str, b: list[float], p: list[float] | None
) -> Row:
    """A row from per-round figures: each side's median, the paired ratio."""
    if p is None:
        return Row(workload, measure, unit, better, median(b))
    return Row(workload, measure, unit, better, median(b), median(p), paired(b, p))


def _rounds(n: int, sides: list[str]) -> list[list[str]]:
    return [sides if r % 2 == 0 else sides[::-1] for r in range(n)]


# --------------------------------------------------------------------------- the processes


@dataclass
class Sides:
    """The upstream, each side's server and worker (workloads 1, 2 and 4)."""

    upstream: str
    boltrl_server: JSON
    boltrl: Proc
    peer_server: JSON | None = None
    peer: Proc | None = None


def start_sides(stack: ExitStack, logs: Path, boltrl_py: str, peer_py: Path | None) -> Sides:
    up = stack.enter_context(
        Proc("upstream", side_argv(boltrl_py, "upstream.py"), logs / "upstream.log")
    )
    upstream = up.read(60)["url"]
    servers = {
        "boltrl": stack.enter_context(
            Proc(
                "boltrl server",
                side_argv(boltrl_py, "boltrl_side.py", "server", "--upstream", upstream),
                logs / "boltrl-server.log",
            )
        )
    }
    if peer_py is not None:  # started together: the peer's takes a while
        servers["peer"] = stack.enter_context(
            Proc(
                "peer server",
                side_argv(peer_py, "peer_side.py", "server", "--upstream", upstream),
                logs / "peer-server.log",
                PEER_ENV,
            )
        )
    boltrl = stack.enter_context(
        Proc(
            "boltrl worker",
            side_argv(boltrl_py, "boltrl_side.py", "worker"),
            logs / "boltrl-worker.log",
        )
    )
    sides = Sides(upstream, servers["boltrl"].read(60), boltrl)
    if peer_py is not None:
        sides.peer = stack.enter_context(
            Proc(
                "peer worker",
                side_argv(peer_py, "peer_side.py", "worker"),
                logs / "peer-worker.log",
                PEER_ENV,
            )
        )
        sides.peer_server = servers["peer"].read(300)
    return sides


# --------------------------------------------------------------------------- 1. capture


def capture(s: Sides, sz: Sizes) -> Report:
    """The LangChain agent (2 model calls + 1 tool) bare, and captured by each side."""
    tools, calls = 1, 2
    rep = Report()
    b_srv = s.boltrl_server
    rep.notes["boltrl recorded per run"] = s.boltrl.call(
        "capture_setup",
        upstream=s.upstream,
        store=b_srv["store"],
        gateway=b_srv["gateway"],
        tools=tools,
    )["check"]
    if s.peer is not None and s.peer_server is not None:
        p_srv = s.peer_server
        rep.notes["Agent Lightning recorded per run"] = s.peer.call(
            "capture_setup", store=p_srv["store"], proxy=p_srv["proxy"], tools=tools
        )["check"]
    bare: list[float] = []
    sides = ["boltrl", "peer"] if s.peer is not None else ["boltrl"]
    cap: dict[str, list[float]] = {side: [] for side in sides}
    med: dict[str, list[float]] = {side: [] for side in sides}
    over: dict[str, list[float]] = {side: [] for side in sides}
    for order in _rounds(sz.rounds, sides):
        got = {}
        for side in order:
            proc = s.boltrl if side == "boltrl" else s.peer
            assert proc is not None
            got[side] = proc.call("capture", pairs=sz.capture_pairs, tools=tools)
        bare_r = median(got["boltrl"]["bare_ms"])
        bare += got["boltrl"]["bare_ms"]
        for side in sides:
            times = got[side]["captured_ms"]
            cap[side] += times
            med[side].append(median(times))
            over[side].append((median(times) - bare_r) / calls)
    w = "1 · capture"
    peer = s.peer is not None
    b99 = percentile(cap["boltrl"], 0.99)
    p99 = percentile(cap["peer"], 0.99) if peer else None
    rep.rows += [
        Row(
            w, "agent run, no capture (2 model calls + 1 tool), median", "ms", "lower", median(bare)
        ),
        compare(w, "agent run with capture, median", "ms", "lower", med["boltrl"], med.get("peer")),
        Row(w, "agent run with capture, p99", "ms", "lower", b99, p99, p99 and b99 / p99),
        compare(
            w, "capture overhead per model call", "ms", "lower", over["boltrl"], over.get("peer")
        ),
    ]
    return rep


# --------------------------------------------------------------------------- 2. proxy


def proxy(s: Sides, sz: Sizes) -> Report:
    """Each side's proxy in front of the common upstream, on its recorded route."""
    targets: dict[str, tuple[str, list[str]]] = {
        "direct": (s.upstream, ["/v1/chat/completions"]),
        "boltrl": (
            s.boltrl_server["gateway"],
            [f"{route}/v1/chat/completions" for route in s.boltrl_server["rollouts"]],
        ),
    }
    if s.peer_server is not None:
        targets["peer"] = (
            s.peer_server["proxy"],
            [f"/rollout/{r}/attempt/{a}/v1/chat/completions" for r, a in s.peer_server["rollouts"]],
        )
    levels = sorted(sz.proxy_requests)
    figs: dict[str, dict[str, list[float]]] = {t: {} for t in targets}
    for order in _rounds(sz.rounds, list(targets)):
        for t in order:
            base, paths = targets[t]
            for c in levels:
                secs, lat = loadgen.load(
                    base, paths if c > 1 else paths[:1], c, sz.proxy_requests[c]
                )
                f = figs[t]
                f.setdefault(f"rps{c}", []).append(len(lat) / secs)
                f.setdefault(f"p50_{c}", []).append(percentile(lat, 0.5) * 1e3)
                f.setdefault(f"p99_{c}", []).append(percentile(lat, 0.99) * 1e3)
    d = figs["direct"]
    for t in targets:
        if t != "direct":
            for q in ("p50", "p99"):
                figs[t][f"added_{q}"] = [
                    x - y for x, y in zip(figs[t][f"{q}_1"], d[f"{q}_1"], strict=True)
                ]
    rep = Report()
    rep.notes["upstream alone"] = (
        f"p50 {median(d['p50_1']):.2f} ms, p99 {median(d['p99_1']):.2f} ms at 1 client; "
        + ", ".join(f"{median(d[f'rps{c}']):,.0f} req/s at {c}" for c in levels)
    )
    w = "2 · proxy"
    measures = [
        ("added latency, p50 at 1 client", "added_p50", "ms", "lower"),
        ("added latency, p99 at 1 client", "added_p99", "ms", "lower"),
        *[
            (f"requests/s, {c} client{'s' if c > 1 else ''}", f"rps{c}", "/s", "higher")
            for c in levels
        ],
        (f"latency p99 at {levels[-1]} clients", f"p99_{levels[-1]}", "ms", "lower"),
    ]
    for label, key, unit, better in measures:
        p = figs["peer"][key] if "peer" in figs else None
        rep.rows.append(compare(w, label, unit, better, figs["boltrl"][key], p))
    return rep


# --------------------------------------------------------------------------- 3. store


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, proc: Proc, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if proc.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} did not come up:\n{proc.tail()}") from None
            time.sleep(0.2)


def _store_server(side: str, backend: str, python: str, logs: Path) -> tuple[Proc, str, str]:
    """A fresh store server (each side's own CLI): (proc, url, health URL)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    if side == "boltrl":
        db = "memory://" if backend == "http" else str(logs / f"served-{port}.db")
        cli = "import sys; from boltrl.cli import main; sys.exit(main())"
        argv = [python, "-c", cli, "store", "serve", "--db", db, "--port", str(port)]
        proc = Proc("boltrl store serve", argv, logs / "boltrl-store.log", stops_on_eof=False)
        return proc, url, f"{url}/healthz"
    argv = [python, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]
    argv += ["store", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    proc = Proc("agl store", argv, logs / "peer-store.log", PEER_ENV, stops_on_eof=False)
    return proc, url, f"{url}/v1/agl/health"


STORE_ROWS = {
    # boltrl's backend: (label, the peer's backend it is compared with)
    "memory": ("in process, memory", "memory"),
    "sqlite": ("in process, SQLite (boltrl) vs memory (AL)", "memory"),
    "http": ("over HTTP, in-memory store server", "http"),
    "http-sqlite": ("over HTTP, SQLite (boltrl) vs in-memory (AL) server", "http"),
}


def _store_run(
    side: str, backend: str, python: str, logs: Path, n: int
) -> tuple[float, float, float]:
    """One run in fresh processes: (rollouts/s, RSS after the run, RSS the run added) of
    the process holding the store (the server's for HTTP)."""
    script = "boltrl_side.py" if side == "boltrl" else "peer_side.py"
    env = PEER_ENV if side == "peer" else None
    with ExitStack() as stack:
        req: JSON = {"backend": backend, "rollouts": n, **STORE}
        server = None
        if backend.startswith("http"):
            server, req["url"], health = _store_server(side, backend, python, logs)
            stack.enter_context(server)
            _wait_http(health, server)
            base = rss_mb(server.pid)
        log = logs / f"{side}-store.log"
        worker = stack.enter_context(
            Proc(f"{side} store worker", side_argv(python, script, "worker"), log, env)
        )
        out = worker.call("store", timeout_s=3600, **req)
        if server is not None:
            after = rss_mb(server.pid)
            return n / out["seconds"], after, after - base
        after = out["rss_after_mb"]
        return n / out["seconds"], after, after - out["rss_before_mb"]


def store(boltrl_py: str, peer_py: Path | None, logs: Path, sz: Sizes) -> Report:
    """enqueue → claim → record 10 → finish, 8 workers; fresh processes per run."""
    configs = [("boltrl", b) for b in STORE_ROWS]
    if peer_py is not None:
        configs += [("peer", "memory"), ("peer", "http")]
    figs: dict[tuple[str, str], list[tuple[float, float, float]]] = {c: [] for c in configs}
    for r in range(sz.store_rounds):
        for side, backend in configs if r % 2 == 0 else configs[::-1]:
            python = boltrl_py if side == "boltrl" else str(peer_py)
            n = sz.store_http_rollouts if backend.startswith("http") else sz.store_rollouts
            figs[(side, backend)].append(_store_run(side, backend, python, logs, n))
    rep = Report()
    for backend, (label, peer_backend) in STORE_ROWS.items():
        w = f"3 · store, {label}"
        n = sz.store_http_rollouts if backend.startswith("http") else sz.store_rollouts
        where = " (server)" if backend.startswith("http") else ""
        b = list(zip(*figs[("boltrl", backend)], strict=True))
        peer = figs.get(("peer", peer_backend))
        p = list(zip(*peer, strict=True)) if peer else [None, None, None]
        measures = [
            (f"rollouts/s ({n:,} rollouts)", "/s", "higher"),
            (f"resident memory after the run{where}", "MiB", "lower"),
            ("… of which the run added", "MiB", "lower"),
        ]
        for i, (what, unit, better) in enumerate(measures):
            rep.rows.append(compare(w, what, unit, better, list(b[i]), p[i] and list(p[i])))
    return rep


# --------------------------------------------------------------------------- 4. convert


def convert(s: Sides, sz: Sizes) -> Report:
    """Finished multi-turn rollouts (6 model calls, 5 tool calls, a reward per tool call
    and a final reward; captured for real, then copied under fresh ids) → training
    records: ``boltrl.transitions`` vs the peer's ``TracerTraceToTriplet``."""
    tools = 5
    rep = Report()
    procs: dict[str, Proc] = {"boltrl": s.boltrl}
    if s.peer is not None:
        procs["peer"] = s.peer
    for side, proc in procs.items():
        rep.notes[f"{side} rollouts for conversion"] = proc.call(
            "collect", rollouts=sz.convert_sources, tools=tools
        )
    ms: dict[str, list[float]] = {side: [] for side in procs}
    for order in _rounds(sz.rounds, list(procs)):
        for side in order:
            out = procs[side].call(
                "convert", rollouts=sz.convert_rollouts, repeat=sz.convert_repeat
            )
            ms[side].append(median(out["ms"]))
            records, ids = out["records"], out["with token ids"]
            rep.notes[f"{side} records"] = f"{records:,} ({ids:,} with token ids)"
    w = "4 · trace → training data"
    what = f"convert {sz.convert_rollouts:,} rollouts (6 model calls each)"
    rep.rows.append(compare(w, what, "ms", "lower", ms["boltrl"], ms.get("peer")))
    return rep


WORKLOADS: dict[str, Callable[..., Report]] = {
    "capture": capture,
    "proxy": proxy,
    "store": store,
    "convert": convert,
}
