"""Dashboard speed on a big store: rollouts-table queries and first paint in a browser.

    uv run python benchmarks/dashboard_bench.py

Builds (once; reused from ``runs/bench/``) a SQLite store of ``--rollouts`` rollouts
with ``--calls`` model calls each, serves the dashboard on it the way ``boltrl
dashboard --store sqlite:///…`` does (read-only SQL on the file), then measures:

- the rollouts-table API (``GET /api/rollouts``: one page of 50 rows with their record
  facts, and the filtered total) for several filters, median of ``--repeat`` requests;
- the runs API cold (the first request after start, which reads every rollout head
  once) and warm;
- first paint and "data shown" of each page in headless Chromium (Debian's, via
  Playwright), on a fresh server for the cold runs page.

Not a test: numbers depend on the machine; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_data import ensure

from boltrl.dashboard import create_dashboard_app, open_source
from boltrl.store.server import RunningServer

ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

TABLE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("newest 50", {}),
    ("page at offset 50,000", {"offset": 50_000}),
    ("status = failed", {"status": "failed"}),
    ("run = bench-b", {"run": "bench-b"}),
    ("run = bench-b, status = succeeded", {"run": "bench-b", "status": "succeeded"}),
    ("agent = searcher (tool steps)", {"agent": "searcher"}),
    ("task id = task-42", {"task": "task-42"}),
]


class Served:
    def __init__(self, path: Path) -> None:
        self.source, _ = open_source(f"sqlite:///{path}")
        self.app = create_dashboard_app(self.source)
        self.server = RunningServer(self.app)
        self.url = self.server.url
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def timed(self, path: str, **params: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        resp = self.http.get(path, params=params)
        resp.raise_for_status()
        return (time.perf_counter() - t) * 1000, resp.json()

    def close(self) -> None:
        self.http.close()
        self.app.state.dashboard.close()
        self.server.stop()
        self.source.close()


def table(srv: Served, repeat: int) -> list[tuple[str, float, int]]:
    out = []
    for name, params in TABLE_CASES:
        times, total = [], 0
        for _ in range(repeat):
            ms, body = srv.timed("/api/rollouts", limit=50, **params)
            times.append(ms)
            total = body["total"]
        out.append((name, statistics.median(times), total))
    return out


def paint(url: str, page: Any, ready: str) -> tuple[float, float]:
    """(first contentful paint, time until ``ready`` matches) in ms from navigation."""
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector(ready, state="attached", timeout=120_000)
    shown = page.evaluate("performance.now()")
    fcp = page.evaluate(
        "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null"
    )
    return float(fcp or 0.0), float(shown)


def browser_figures(path: Path, repeat: int, detail: str) -> list[tuple[str, float, float]]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        srv = Served(path)  # fresh: the first runs page waits for the first read of the store
        try:
            fcp, shown = paint(f"{srv.url}/#/runs", page, ".run svg.plot circle")
            out.append(("runs, just after start", fcp, shown))
            pages = [
                ("runs (warm)", "#/runs", ".run svg.plot circle"),
                ("rollouts", "#/rollouts", "tbody tr td a"),
                ("rollouts, run = bench-b", "#/rollouts?run=bench-b", "tbody tr td a"),
                ("rollout detail", f"#/rollout/{detail}", ".node.call"),
                ("workers", "#/workers", "tr[data-worker]"),
            ]
            for name, hash_, ready in pages:
                runs = [paint(f"{srv.url}/{hash_}", page, ready) for _ in range(repeat)]
                out.append((name, statistics.median(r[0] for r in runs),
                            statistics.median(r[1] for r in runs)))  # fmt: skip
            page.goto("about:blank")
        finally:
            srv.close()
            browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=10, help="model calls per rollout")
    ap.add_argument("--db", type=Path, default=Path("runs/bench/dashboard.db"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    ensure(args.db, args.rollouts, args.calls)
    size = sum(f.stat().st_size for f in args.db.parent.glob(args.db.name + "*"))
    print(f"store: {args.db} ({size / 2**30:.2f} GiB)")

    srv = Served(args.db)
    try:
        cold, runs = srv.timed("/api/runs")
        warm = statistics.median(srv.timed("/api/runs")[0] for _ in range(args.repeat))
        points = sum(len(r["steps"]) for r in runs["runs"])
        print(f"\nGET /api/runs: cold {cold:.0f} ms, warm {warm:.1f} ms ({points} step points)")
        print("\n| rollouts table (GET /api/rollouts, 50 rows) | median (ms) | matching |")
        print("|---|---:|---:|")
        for name, ms, total in table(srv, args.repeat):
            print(f"| {name} | {ms:.1f} | {total:,} |")
        detail = f"ro-bench{args.rollouts // 2:08d}"
        print("\n| other API | median (ms) |\n|---|---:|")
        call = f"chatcmpl-bench{args.rollouts // 2:08d}-0"
        paths = ["/api/facets", "/api/workers", f"/api/rollouts/{detail}"]
        for path in [*paths, f"/api/rollouts/{detail}/calls/{call}/tokens"]:
            ms = statistics.median(srv.timed(path)[0] for _ in range(args.repeat))
            print(f"| GET {path} | {ms:.1f} |")
    finally:
        srv.close()
    if args.no_browser:
        return
    print("\n| page (headless Chromium) | first paint (ms) | data shown (ms) |")
    print("|---|---:|---:|")
    for name, fcp, shown in browser_figures(args.db, args.repeat, detail):
        print(f"| {name} | {fcp:.0f} | {shown:.0f} |")


if __name__ == "__main__":
    main()
