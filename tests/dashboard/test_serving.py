"""Serving the dashboard: live events, the token, mounting next to the store server, and
the read-only SQL source beside a SQLite store that another owner holds."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import serve

from boltrl import Task
from boltrl.dashboard import create_dashboard_app, open_source
from boltrl.dashboard.model import Filters
from boltrl.errors import InvalidInput
from boltrl.store import open_store
from boltrl.store.server import RunningServer, create_store_app


def _events(url: str, out: list[tuple[str, Any]], stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as http, http.stream("GET", f"{url}/api/events") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event or "", json.loads(line[6:])))
            if stop.is_set():
                return


def _wait_for(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_events_push_changes_and_ticks_while_running() -> None:
    store = open_store("memory://")
    try:
        with serve(store) as srv:
            got: list[tuple[str, Any]] = []
            stop = threading.Event()
            t = threading.Thread(target=_events, args=(srv.url, got, stop), daemon=True)
            t.start()
            _wait_for(lambda: any(e == "hello" for e, _ in got))
            [rid] = store.enqueue([Task(id="live", input={})])
            _wait_for(lambda: any(e == "change" and rid in d["changed"] for e, d in got))
            att = store.claim("w-live")
            assert att is not None
            _wait_for(lambda: any(e == "change" and d["counts"]["running"] == 1 for e, d in got))
            _wait_for(lambda: any(e == "tick" for e, _ in got), timeout=5)
            store.finish(att, "succeeded", reward=1.0)
            _wait_for(lambda: any(e == "change" and d["finished"] == 1 for e, d in got))
            last = [d for e, d in got if e == "change"][-1]
            assert last["counts"]["succeeded"] == 1 and last["counts"]["running"] == 0
            stop.set()
            srv.app.state.dashboard.close()  # ends the stream
            t.join(10)
            assert not t.is_alive()
    finally:
        store.close()


def test_token_guards_the_api_and_the_page_trades_it_for_a_cookie() -> None:
    store = open_store("memory://")
    try:
        with serve(store, token="s3cret") as srv:
            assert srv.http.get("/").status_code == 200  # the page shell holds no data
            assert srv.http.get("/static/app.js").status_code == 200
            resp = srv.http.get("/api/runs")
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
            assert (
                srv.http.get("/api/runs", headers={"Authorization": "Bearer nope"}).status_code
                == 401
            )
            ok = srv.http.get("/api/runs", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200
            with httpx.Client(base_url=srv.url) as browser:
                resp = browser.get("/?token=s3cret")
                assert resp.status_code == 303 and resp.headers["location"] == "/"
                assert "httponly" in resp.headers["set-cookie"].lower()
                assert browser.get("/api/runs").status_code == 200
    finally:
        store.close()


def test_mounted_next_to_the_store_server() -> None:
    store = open_store("memory://")
    app = create_store_app(store)
    dash = create_dashboard_app(store, poll_s=0.1)
    app.mount("/dashboard", dash)
    server = RunningServer(app)
    try:
        with httpx.Client(base_url=server.url) as http:
            store.enqueue([Task(id="m", input={}, metadata={"run": "r", "step": 0})])
            page = http.get("/dashboard/")
            assert page.status_code == 200 and 'src="static/app.js"' in page.text
            assert http.get("/dashboard/static/style.css").status_code == 200
            assert http.get("/dashboard/api/runs").json()["runs"][0]["name"] == "r"
            assert http.get("/store/count").json() == {"count": 1}
    finally:
        dash.state.dashboard.close()
        server.stop()
        store.close()


def test_sql_source_reads_a_file_the_store_holds(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    store = open_store(f"sqlite:///{path}")  # holds the file's lock
    try:
        source, opened = open_source(f"sqlite:///{path}")
        assert opened is None
        token = source.change_token()
        [rid] = store.enqueue([Task(id="t", input={}, metadata={"run": "x", "step": 1})])
        assert source.change_token() != token
        [h] = source.heads_of([rid])
        assert (h.run, h.step, h.status, h.task_id) == ("x", 1, "queued", "t")
        assert source.page(Filters(run="x"), 10, 0)[1] == 1
        source.close()
    finally:
        store.close()


def test_sql_source_refuses_a_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no SQLite store"):
        open_source(f"sqlite:///{tmp_path}/missing.db")
    (tmp_path / "junk.db").write_bytes(b"not a database at all, not even close" * 10)
    with pytest.raises(InvalidInput, match="not a boltrl SQLite store"):
        open_source(f"sqlite:///{tmp_path}/junk.db")


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        (Filters(run="x"), "rollouts_by_run"),
        (Filters(task="t"), "rollouts_by_task"),
        (Filters(agent="a"), "records_by_agent"),
        (Filters(status=("failed",)), "rollouts_by_status"),
    ],
)
def test_sql_filters_use_the_store_indexes(tmp_path: Path, filters: Filters, index: str) -> None:
    from boltrl.dashboard.sqlsource import SqliteSource, _where

    store = open_store(f"sqlite:///{tmp_path}/plan.db")
    store.close()
    source = SqliteSource(tmp_path / "plan.db")
    try:
        where, args = _where(filters)
        plan = source._q(
            f"EXPLAIN QUERY PLAN SELECT id FROM rollouts{where} ORDER BY ord DESC", args
        )
        assert any(index in str(row[-1]) for row in plan), plan
    finally:
        source.close()


def test_dashboard_command_serves_a_sqlite_file_and_stops_on_sigint(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "cli.db"
    store = open_store(f"sqlite:///{path}")  # a "trainer" holds the file meanwhile
    try:
        store.enqueue([Task(id="c", input={}, metadata={"run": "cli", "step": 0})])
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "boltrl.cli",
                "dashboard",
                "--store",
                f"sqlite:///{path}",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith(f"boltrl dashboard: sqlite:///{path} on http://127.0.0.1:"), line
            url = line.rsplit(" on ", 1)[1].strip().rstrip("/")
            with httpx.Client(base_url=url, timeout=10) as http:
                assert http.get("/api/runs").json()["runs"][0]["name"] == "cli"
                rebound = http.get("/api/runs", headers={"Host": "evil.example:4748"})
                assert rebound.status_code == 400  # DNS rebinding: a foreign Host is refused
                with http.stream("GET", "/api/events") as events:  # an open live stream
                    next(events.iter_lines())
                    t0 = time.monotonic()
                    proc.send_signal(signal.SIGINT)
                    assert proc.wait(10) == 130  # interrupted, like every boltrl server
                    assert time.monotonic() - t0 < 2.5  # the live stream did not hold it up
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        store.close()


def test_dashboard_command_refuses_an_open_port_without_token(capsys: Any) -> None:
    from boltrl.cli import main

    assert main(["dashboard", "--store", "memory://", "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err
