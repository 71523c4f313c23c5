"""The dashboard web app: a JSON API over a ``Source``, server-sent events, and the
static single-page front end (vanilla JS/CSS/SVG shipped in this package: it works
offline, nothing is fetched from a CDN).

Pages and API use relative URLs, so the app can be mounted under a prefix next to the
store server (``store_app.mount("/dashboard", create_dashboard_app(store))``). With a
token, every ``/api`` route requires it, as ``Authorization: Bearer <token>`` or as the
cookie that opening the page once with ``?token=<token>`` sets (browsers cannot add a
header to ``EventSource``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.responses import StreamingResponse

from boltrl._serving import Guard, check_token
from boltrl.credit import CreditConfig
from boltrl.dashboard.detail import rollout_detail
from boltrl.dashboard.events import Hub
from boltrl.dashboard.model import STATUSES, Filters, Source
from boltrl.dashboard.promotions import promotions_view
from boltrl.dashboard.source import source_for
from boltrl.dashboard.stats import Tracker
from boltrl.dashboard.tokens import TokenDecoder, token_view
from boltrl.dashboard.views import rollouts_page, workers_view
from boltrl.errors import BoltrlError, InvalidInput, NotFound
from boltrl.store import _wire
from boltrl.store._checks import MAX_INT
from boltrl.store.base import Store
from boltrl.store.server import install_error_handlers

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
COOKIE = "boltrl_dashboard_token"
_MAX_LIMIT = 500
T = TypeVar("T")


def _error(e: BoltrlError) -> Response:
    return JSONResponse(_wire.error_body(e), status_code=e.status_code)


@runtime_checkable
class _SourceLike(Source, Protocol):
    """Tells a ready ``Source`` from a ``Store`` at run time."""


class Dashboard:
    """What one dashboard app holds: its source, tracker, event hub and decoder."""

    def __init__(
        self,
        source: Source,
        *,
        tokenizer: str | None = None,
        poll_s: float = 0.5,
        promotions: Path | None = None,
    ) -> None:
        self.source = source
        self.promotions = promotions
        self.tracker = Tracker(source)
        self.hub = Hub(self.tracker, poll_s=poll_s)
        self.decoder = TokenDecoder(tokenizer)
        # Read the store once now, so the first page does not wait for it.
        threading.Thread(target=self._warm, name="boltrl-dashboard-warm", daemon=True).start()

    def _warm(self) -> None:
        try:
            self.tracker.refresh()
        except Exception as e:  # the page's own refresh will report it
            log.debug("dashboard: warm-up read failed: %s", e)

    def close(self) -> None:
        """End the live streams and stop the watcher; the source stays the caller's."""
        self.hub.close()


def _filters(status: str | None, run: str | None, agent: str | None, task: str | None) -> Filters:
    statuses = tuple(s for s in (status or "").split(",") if s)
    for s in statuses:
        if s not in STATUSES:
            raise InvalidInput(f"status: unknown {s!r}; expected one of {', '.join(STATUSES)}")
    return Filters(statuses, run or None, agent or None, task or None)


def _page_args(limit: int, offset: int) -> tuple[int, int]:
    if not 1 <= limit <= _MAX_LIMIT:
        raise InvalidInput(f"limit: must be between 1 and {_MAX_LIMIT}, got {limit}")
    if not 0 <= offset <= MAX_INT:  # beyond it SQLite overflows
        raise InvalidInput(f"offset: must be between 0 and {MAX_INT}, got {offset}")
    return limit, offset


def _router(dash: Dashboard) -> APIRouter:
    router = APIRouter(prefix="/api")
    src = dash.source

    async def off(fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a blocking source call in a worker thread."""
        return await anyio.to_thread.run_sync(partial(fn, *args, **kw))

    @router.get("/summary")
    async def summary() -> dict[str, Any]:
        await off(dash.tracker.refresh)
        runs = await off(dash.tracker.runs)
        return {"store": src.label, "counts": runs["counts"], "now": runs["now"]}

    @router.get("/runs")
    async def runs() -> dict[str, Any]:
        await off(dash.tracker.refresh)
        out: dict[str, Any] = await off(dash.tracker.runs)
        return out

    @router.get("/facets")
    async def facets() -> dict[str, Any]:
        await off(dash.tracker.refresh)
        runs = await off(dash.tracker.runs)
        names = sorted({r["name"] for r in runs["runs"] if r["name"] is not None})
        return {"runs": names, "agents": await off(src.agents), "statuses": list(STATUSES)}

    @router.get("/rollouts")
    async def rollouts(
        status: str | None = None,
        run: str | None = None,
        agent: str | None = None,
        task: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        f = _filters(status, run, agent, task)
        limit, offset = _page_args(limit, offset)
        out: dict[str, Any] = await off(rollouts_page, src, f, limit, offset)
        return out

    @router.get("/rollouts/{rollout_id}")
    async def detail(rollout_id: str, credit: str = "final", gamma: float = 1.0) -> Response:
        cfg = CreditConfig(mode=credit, gamma=gamma)  # type: ignore[arg-type]

        def build() -> dict[str, Any]:
            rollout = src.get(rollout_id)
            heads = src.heads_of([rollout_id])
            if not heads:
                raise NotFound(f"unknown rollout {rollout_id!r}")
            return rollout_detail(rollout, heads[0], src.group_rewards(heads[0]), cfg)

        return JSONResponse(await off(build))

    @router.get("/rollouts/{rollout_id}/calls/{call_id}/tokens")
    async def tokens(rollout_id: str, call_id: str) -> dict[str, Any]:
        rollout = await off(src.get, rollout_id)
        call = next((c for c in rollout.calls if c.id == call_id), None)
        if call is None:
            raise NotFound(f"rollout {rollout_id!r} has no call {call_id!r}")
        out: dict[str, Any] = await off(token_view, call, dash.decoder)
        return out

    @router.get("/workers")
    async def workers() -> dict[str, Any]:
        out: dict[str, Any] = await off(workers_view, src)
        return out

    @router.get("/promotions")
    async def promotions() -> dict[str, Any]:
        out: dict[str, Any] = await off(promotions_view, dash.promotions)
        return out

    @router.get("/events")
    async def events(request: Request) -> StreamingResponse:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            dash.hub.stream(request.is_disconnected),
            media_type="text/event-stream",
            headers=headers,
        )

    return router


def create_dashboard_app(
    store: Store | Source,
    token: str | None = None,
    *,
    tokenizer: str | None = None,
    poll_s: float = 0.5,
    allowed_hosts: Collection[str] | None = None,
    promotions: str | Path | None = None,
) -> FastAPI:
    """The dashboard for a store (or a ready ``Source``), as an ASGI app.

    ``app.state.dashboard.close()`` ends live streams (call it before stopping the
    server); the store stays the caller's to close. ``tokenizer`` names a Hugging Face
    tokenizer to decode response tokens with (optional). ``allowed_hosts``, when set,
    are the only ``Host`` names served (see ``boltrl._serving.Guard``). ``promotions``
    is a ``boltrl serve`` decision log (``promotions.jsonl``) for the Promotions page.
    """
    check_token("token", token)  # at once: middleware is built on the first request
    source = store if isinstance(store, _SourceLike) else source_for(store)
    log_path = None if promotions is None else Path(promotions)
    dash = Dashboard(source, tokenizer=tokenizer, poll_s=poll_s, promotions=log_path)
    app = FastAPI(title="boltrl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dashboard = dash
    install_error_handlers(app)
    app.include_router(_router(dash))
    app.add_middleware(
        Guard,
        reject=_error,
        token=token,
        token_hint="open the dashboard with ?token=<token>",
        cookie=COOKIE,
        protected=lambda path: path.startswith("/api"),
        allowed_hosts=allowed_hosts,
    )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index(request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            # Trade the token in the URL for a cookie, and drop it from the address bar.
            root = request.scope.get("root_path", "") + "/"
            resp: Response = RedirectResponse(root, status_code=303)
            resp.set_cookie(COOKIE, given, httponly=True, samesite="strict", path=root)
            return resp
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    return app
