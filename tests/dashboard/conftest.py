"""Fixtures of the dashboard tests: filled stores (memory and SQLite), a served
dashboard, and a real headless Chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_fill import add_run, add_tool_only, run_real

from boltrl.dashboard import create_dashboard_app
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl.store.server import RunningServer, serve_in_thread

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Filled:
    kind: str
    store: Store
    real: list[str]
    """Ids of the two real multi-agent rollouts."""
    running: str
    """Id of the rollout left running (a tool step, no call)."""


def fill(store: Store, kind: str) -> Filled:
    real = run_real(store, 2)
    add_run(store, "run-a", 6, 6)
    add_run(store, "run-b", 3, 4, worker="w-synth-b")
    return Filled(kind, store, real, add_tool_only(store))


@pytest.fixture(scope="module", params=["memory", "sqlite", "http"])
def filled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Filled]:
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path_factory.mktemp('dash')}/store.db")
        yield fill(store, request.param)
        store.close()
        return
    backing = open_store("memory://")
    if request.param == "memory":
        yield fill(backing, request.param)
    else:  # a served store: the dashboard reads it through the HTTP client
        with serve_in_thread(backing) as server:
            client = open_store(server.url)
            yield fill(client, request.param)
            client.close()
    backing.close()


@dataclass
class Served:
    url: str
    app: Any
    http: httpx.Client

    def get(self, path: str, **params: Any) -> Any:
        resp = self.http.get(path, params={k: v for k, v in params.items() if v is not None})
        assert resp.status_code == 200, resp.text
        return resp.json()


@contextmanager
def serve(store: Any, **kw: Any) -> Iterator[Served]:
    app = create_dashboard_app(store, poll_s=0.1, **kw)
    server = RunningServer(app)
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        yield Served(server.url, app, http)
    finally:
        http.close()
        app.state.dashboard.close()
        server.stop()


@pytest.fixture(scope="module")
def served(filled: Filled) -> Iterator[Served]:
    with serve(filled.store) as srv:
        yield srv


# -- browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: Playwright's sync API keeps an event loop running in the main thread
    # while it is open, which breaks later tests that call asyncio.run().
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def shots() -> Path:
    """Where screenshots go: ``artifacts/screenshots/`` (git-ignored) in the repository."""
    out = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, f"the page logged errors: {errors}"
