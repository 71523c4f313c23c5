"""The store over HTTP: a FastAPI app around any ``Store``, and ways to run it.

Routes live under ``/store`` (``_wire.PREFIX``) so a gateway or dashboard can be
mounted on the same app. Every error is a 4xx/5xx with the JSON body
``{"error": {"code", "message"}}``, whose ``code`` the client maps back to the same
exception class an in-process store raises.

Store calls block (locks, SQLite, long-polls), so they run in worker threads; long-polls
(``claim``/``wait``, capped at ``MAX_POLL_S`` per request) get their own larger thread
pool so waiting runners cannot starve quick calls. Mutating requests may carry an
``Idempotency-Key`` header: the response is remembered, and a retry with the same key
(the client's retry after a lost response) gets it again instead of acting twice. A key
is bound to its route and request body: used again on another route it is a new key,
with another body it is refused (400). Over an embedded store (memory, SQLite) an
enqueue's key is kept by the store itself, in the enqueue's own transaction, so a retry
after a restart of a SQLite-backed server does not enqueue again; a retried finish is
answered by the store's own rule (the same token and outcome answer success). A
long-poll claim whose client went away gives its rollout back without spending an
attempt.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from boltrl._serving import (
    MAX_BODY_BYTES,
    Guard,
    ServerThread,
    bind,
    check_exposure,
    check_token,
    local_hosts,
    serve_forever,
    url_of,
)
from boltrl.errors import BoltrlError, InvalidInput, StoreUnavailable
from boltrl.records import Resources
from boltrl.store import _wire as w
from boltrl.store._checks import check_number, validation_message
from boltrl.store._engine import StoreEngine
from boltrl.store._sessions import session_rollout_id
from boltrl.store.base import SessionStore, Store

log = logging.getLogger(__name__)

T = TypeVar("T")
_IDEMPOTENCY_CACHE = 4096


def _json(payload: BaseModel | bytes) -> Response:
    body = payload if isinstance(payload, bytes) else payload.model_dump_json().encode()
    return Response(content=body, media_type="application/json")


def _error(e: BoltrlError) -> JSONResponse:
    return JSONResponse(w.error_body(e), status_code=e.status_code)


async def _parse(request: Request, model: type[T] | TypeAdapter[T]) -> T:
    raw = await request.body()
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_json(raw)
        assert issubclass(model, BaseModel)
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise InvalidInput(validation_message(e)) from None


class _Once:
    """Remembers responses by ``Idempotency-Key`` so a retried request acts only once.

    A request whose answer is the rollout as it now stands (finish, cancel) remembers
    how to answer again instead of the answer itself: a finished rollout's body carries
    all its records (tens of kB), and thousands of them are remembered at a time.
    """

    def __init__(self) -> None:
        self._done: OrderedDict[str, tuple[str, int, bytes | Callable[[], Awaitable[Response]]]] = (
            OrderedDict()
        )
        """(route, key) → (request digest, status, answer or how to answer again)."""
        self._inflight: dict[str, asyncio.Event] = {}

    async def __call__(
        self,
        request: Request,
        fn: Callable[[], Awaitable[Response]],
        replay: Callable[[], Awaitable[Response]] | None = None,
    ) -> Response:
        """Answer with ``fn``, or as the first request with this key was answered; with
        ``replay``, a repeat of a request that succeeded is answered by calling it."""
        given = request.headers.get("idempotency-key")
        if given is None:
            return await _guard(fn)
        key = f"{request.url.path}\n{given}"  # a key answers its own route only
        digest = await request_digest(request)
        while key in self._inflight:  # the original is still running: wait for its answer
            await self._inflight[key].wait()
        if key in self._done:
            first, status, body = self._done[key]
            if first != digest:
                return _error(reused_key(given))
            if not isinstance(body, bytes):
                return await _guard(body)
            return Response(content=body, status_code=status, media_type="application/json")
        event = self._inflight[key] = asyncio.Event()
        try:
            resp = await _guard(fn)
            if resp.status_code < 500:
                again: bytes | Callable[[], Awaitable[Response]] = bytes(resp.body)
                if replay is not None and resp.status_code < 300:
                    again = replay
                self._done[key] = (digest, resp.status_code, again)
                while len(self._done) > _IDEMPOTENCY_CACHE:
                    self._done.popitem(last=False)
            return resp
        finally:
            del self._inflight[key]
            event.set()


async def request_digest(request: Request) -> str:
    """What an idempotency key is bound to besides its route: the request body."""
    return hashlib.sha256(await request.body()).hexdigest()


def reused_key(key: str) -> InvalidInput:
    return InvalidInput(f"Idempotency-Key {key!r} was first used for another request")


async def _guard(fn: Callable[[], Awaitable[Response]]) -> Response:
    try:
        return await fn()
    except BoltrlError as e:
        return _error(e)


def create_store_app(
    store: Store,
    token: str | None = None,
    *,
    allowed_hosts: Collection[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """A FastAPI app serving ``store`` under ``/store``.

    ``token``, when set, is required as ``Authorization: Bearer <token>`` on every store
    route (``/healthz`` stays open; an empty token is refused). ``allowed_hosts``, when
    set, are the only ``Host`` names served. POSTs must say ``Content-Type:
    application/json`` (415 otherwise: a web page's cross-site form cannot) and carry at
    most ``max_body_bytes`` (413). What a store accepts reads back: non-finite numbers,
    out-of-range integers, nesting deeper than ``_checks.MAX_DEPTH`` and tasks or
    records over ``_checks.MAX_VALUE_BYTES`` get a 400 naming the field, before anything
    is written. See ``boltrl._serving.Guard``. The app does not own the store: closing
    it stays with the caller.
    """
    check_token("token", token)  # at once: middleware is built on the first request
    app = FastAPI(title="boltrl store", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(store_router(store))
    app.add_middleware(
        Guard,
        reject=_error,
        token=token,
        protected=lambda path: path.startswith(w.PREFIX),
        allowed_hosts=allowed_hosts,
        json_only=True,
        max_body_bytes=max_body_bytes,
    )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def install_error_handlers(app: FastAPI) -> None:
    """Make every error on ``app`` answer ``{"error": {"code", "message"}}``."""

    async def boltrl_error(_: Request, e: Exception) -> Response:
        assert isinstance(e, BoltrlError)
        return _error(e)

    async def bad_request(_: Request, e: Exception) -> Response:
        assert isinstance(e, RequestValidationError)
        err = e.errors()[0] if e.errors() else {"loc": (), "msg": str(e)}
        path = ".".join(str(p) for p in err["loc"] if p != "body") or "body"
        return _error(InvalidInput(f"{path}: {err['msg']}"))

    async def http_error(_: Request, e: Exception) -> Response:
        assert isinstance(e, StarletteHTTPException)
        code = {401: "unauthorized", 404: "not_found"}.get(e.status_code, "http_error")
        body = {"error": {"code": code, "message": str(e.detail)}}
        return JSONResponse(body, status_code=e.status_code)

    app.add_exception_handler(BoltrlError, boltrl_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(StarletteHTTPException, http_error)


def store_router(store: Store) -> APIRouter:
    """The store's routes, for mounting into an app of your own (put a ``Guard`` with
    the token in front of it: the routes check none)."""

    router = APIRouter(prefix=w.PREFIX)
    once = _Once()
    long_polls: list[anyio.CapacityLimiter] = []

    async def run(fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    async def poll(fn: Callable[[], T]) -> T:
        if not long_polls:  # a limiter must be made inside the event loop
            long_polls.append(anyio.CapacityLimiter(512))
        return await anyio.to_thread.run_sync(fn, limiter=long_polls[0], abandon_on_cancel=True)

    def capped(wait_s: Any, name: str) -> float:
        return min(check_number(name, wait_s), w.MAX_POLL_S)

    @router.post("/rollouts")
    async def enqueue(request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        durable = key is not None and isinstance(store, StoreEngine)

        async def go() -> Response:
            req = await _parse(request, w.EnqueueRequest)
            kw: dict[str, Any] = {"max_attempts": req.max_attempts, "timeout_s": req.timeout_s}
            if durable:  # the store keeps the key with the rollouts (see the module doc)
                kw["idempotency"] = (key, await request_digest(request))
            return _json(w.Ids(ids=await run(partial(store.enqueue, req.tasks, **kw))))

        return await (_guard(go) if durable else once(request, go))

    @router.post("/claim")
    async def claim(request: Request) -> Response:
        async def go() -> Response:
            req = await _parse(request, w.ClaimRequest)
            wait_s = capped(req.wait_s, "wait_s")
            take = partial(store.claim, req.worker_id, lease_s=req.lease_s, wait_s=wait_s)
            att = await claim_for(request, take)
            return _json(w.OPTIONAL_ATTEMPT.dump_json(att))

        return await once(request, go)

    async def claim_for(request: Request, take: Callable[[], Any]) -> Any:
        """Claim, unless the client is gone by the time a rollout is taken: then the
        claim is undone (no attempt spent) and the answer, which nobody reads, is a 503
        that is not remembered."""
        release = getattr(store, "release", None)
        lock, box = threading.Lock(), {"gone": False, "att": None}

        def work() -> Any:
            att = take()
            with lock:
                gone = box["gone"]
                box["att"] = att
            if gone and att is not None and release is not None:
                release(att)  # the waiting request was cancelled under us
                log.info("store: claim of %s undone: its client disconnected", att.rollout_id)
            return att

        try:
            att = await poll(work)
        except BaseException:
            with lock:
                box["gone"], att = True, box["att"]
            if att is not None and release is not None:
                release(att)
            raise
        if att is not None and release is not None and await request.is_disconnected():
            await run(partial(release, att))
            log.info("store: claim of %s undone: its client disconnected", att.rollout_id)
            raise StoreUnavailable("the claiming client disconnected")
        return att

    @router.post("/heartbeat")
    async def heartbeat(request: Request) -> Response:
        req = await _parse(request, w.HeartbeatRequest)
        return _json(await run(partial(store.heartbeat, req.attempt, lease_s=req.lease_s)))

    @router.post("/records")
    async def record(request: Request) -> Response:
        req = await _parse(request, w.RecordBatch)

        def store_all() -> w.RecordResults:
            results: list[w.ErrorBody | None] = []
            for item in req.items:  # each item stands or falls alone, like its own call
                try:
                    store.record(item.attempt, item.records)
                    results.append(None)
                except BoltrlError as e:
                    results.append(w.ErrorBody(code=e.code, message=str(e)))
            return w.RecordResults(results=results)

        return _json(await run(store_all))

    async def current(rollout_id: str) -> Response:
        return _json(await run(partial(store.get, rollout_id)))

    @router.post("/finish")
    async def finish(request: Request) -> Response:
        rollout_id = ""

        async def go() -> Response:
            nonlocal rollout_id
            req = await _parse(request, w.FinishRequest)
            rollout_id = req.attempt.rollout_id
            call = partial(
                store.finish,
                req.attempt,
                req.status,
                reward=req.reward,
                error=req.error,
                error_kind=req.error_kind,
                retryable=req.retryable,
            )
            return _json(await run(call))

        return await once(request, go, lambda: current(rollout_id))

    @router.post("/rollouts/{rollout_id}/cancel")
    async def cancel(request: Request, rollout_id: str) -> Response:
        async def go() -> Response:
            return _json(await run(partial(store.cancel, rollout_id)))

        return await once(request, go, lambda: current(rollout_id))

    @router.get("/rollouts/{rollout_id}")
    async def get(rollout_id: str) -> Response:
        return _json(await run(partial(store.get, rollout_id)))

    @router.get("/rollouts/{rollout_id}/current_attempt")
    async def current_attempt(rollout_id: str) -> Response:
        return _json(await run(partial(store.current_attempt, rollout_id)))

    @router.get("/rollouts")
    async def query(status: str | None = None, limit: int = 100, offset: int = 0) -> Response:
        found = await run(partial(store.query, status=status, limit=limit, offset=offset))
        return _json(w.ROLLOUTS.dump_json(found))

    @router.get("/count")
    async def count(status: str | None = None) -> Response:
        return _json(w.Count(count=await run(partial(store.count, status=status))))

    @router.post("/wait")
    async def wait(request: Request) -> Response:
        req = await _parse(request, w.WaitRequest)
        timeout_s = capped(req.timeout_s, "timeout_s")
        return _json(w.ROLLOUTS.dump_json(await poll(partial(store.wait, req.ids, timeout_s))))

    @router.post("/resources")
    async def publish(request: Request) -> Response:
        async def go() -> Response:
            res = await _parse(request, Resources)
            return _json(await run(partial(store.publish_resources, res)))

        return await once(request, go)

    @router.get("/resources")
    async def resources() -> Response:
        return _json(await run(store.resources))

    def sessions() -> SessionStore:
        if not isinstance(store, SessionStore):
            raise InvalidInput(f"this store ({type(store).__name__}) keeps no sessions")
        return store

    @router.post("/sessions/touch")
    async def touch_session(request: Request) -> Response:
        req = await _parse(request, w.TouchSessionRequest)
        call = partial(
            sessions().touch_session,
            req.session_id,
            feedback_timeout_s=req.feedback_timeout_s,
            metadata=req.metadata,
        )
        return _json(await run(call))

    @router.post("/sessions/feedback")
    async def feedback(request: Request) -> Response:
        session_id = ""

        async def go() -> Response:
            nonlocal session_id
            req = await _parse(request, w.FeedbackRequest)
            session_id = req.session_id
            call = partial(sessions().feedback, req.session_id, req.reward, name=req.name)
            return _json(await run(call))

        async def again() -> Response:
            return await current(session_rollout_id(session_id))

        return await once(request, go, again)

    @router.get("/sessions/rewarded")
    async def rewarded_sessions(after: int = 0, limit: int = 100) -> Response:
        call = partial(sessions().rewarded_sessions, after=after, limit=limit)
        return _json(await run(call))

    @router.post("/sessions/expire")
    async def expire_sessions() -> Response:
        return _json(w.Count(count=await run(sessions().expire_sessions)))

    @router.get("/workers")
    async def workers() -> Response:
        workers = getattr(store, "workers", None)
        found = [] if workers is None else await run(workers)
        return _json(TypeAdapter(list[Any]).dump_json(found))

    return router


# -- running a server -----------------------------------------------------------------------


class RunningServer:
    """A uvicorn server running an ASGI app in a background thread (tests, embedding)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._thread = ServerThread(app, bind(host, port), name="boltrl-store")
        self.url = self._thread.url
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        self._thread.stop(10)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _hosts(host: str, token: str | None) -> list[str] | None:
    """Without a token, serve only requests addressed to this machine's own names."""
    return local_hosts(host) if token is None else None


def serve_in_thread(
    store: Store,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> RunningServer:
    """Serve ``store`` over HTTP from a background thread; ``.url`` says where."""
    check_exposure(host, token)
    app = create_store_app(
        store, token, allowed_hosts=_hosts(host, token), max_body_bytes=max_body_bytes
    )
    return RunningServer(app, host=host, port=port)


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 4747,
    token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Serve ``store`` in the foreground until interrupted (what ``boltrl store serve`` runs).

    ``on_ready`` is called with the URL once the socket is bound (``port=0`` picks one).
    """
    check_exposure(host, token)
    app = create_store_app(
        store, token, allowed_hosts=_hosts(host, token), max_body_bytes=max_body_bytes
    )
    sock = bind(host, port)
    if on_ready is not None:
        on_ready(url_of(sock))
    serve_forever(app, sock)
