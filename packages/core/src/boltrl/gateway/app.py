"""The gateway's ASGI app: OpenAI-compatible routes, recorded per rollout.

Routes (each also under ``/v1/...`` without a rollout, served but not recorded):

- ``POST /rollouts/{rollout_id}/attempts/{number}/{token}/v1/chat/completions``
- ``POST /rollouts/{rollout_id}/attempts/{number}/{token}/v1/responses``
- ``GET  .../v1/models`` and ``.../v1/models/{model}``
- ``GET  /health``

With ``sessions`` (``gateway.sessions``): the same OpenAI routes under
``/sessions/{session_id}/v1`` (or ``/v1`` with an ``X-Boltrl-Session`` header), recorded
as the session's rollout without any lease token, and ``POST
/sessions/{session_id}/feedback``. A training gateway serves no session route.

A recorded route names the attempt and carries its lease token (``Attempt.route``): a
call of an attempt that is no longer current gets a 409 and is not recorded. The
tokenless ``/rollouts/{rollout_id}/v1`` still answers 404 for an unknown or finished
rollout, and 409 for a running one: it records nothing.

Per call: parse and validate (400 naming the field, nothing recorded) → find the
rollout's running attempt (404 when unknown or finished) → generate (backend failure:
the call is recorded ``failed``, then 502/503) → record the call → respond. The call id
is the response id (``chatcmpl-…`` / ``resp_…``). A streamed call to a
``StreamingBackend`` is answered live, its text leaving as it is sampled and the call
recorded before the stream's end (``gateway._live``). Handlers are plain Starlette
endpoints on a FastAPI app: no per-request model validation on the hot path.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from boltrl._common import JSON
from boltrl._serving import MAX_BODY_BYTES, Guard, check_token
from boltrl.errors import BackendUnavailable, BoltrlError, Unauthorized
from boltrl.gateway import _live, chat, responses
from boltrl.gateway._errors import RequestError, error_body
from boltrl.gateway._json import dumps
from boltrl.gateway._request import ParsedCall, read_body
from boltrl.gateway.backend import Backend, Generation, stream_of
from boltrl.gateway.recording import Recorder, check_generation
from boltrl.gateway.sessions import SessionConfig, Sessions
from boltrl.records import Attempt
from boltrl.store._sessions import session_rollout_id
from boltrl.store.base import Store

log = logging.getLogger(__name__)

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status, media_type="application/json")


def _error(status: int, message: str, *, param: str | None = None, code: str | None) -> Response:
    return _json(error_body(status, message, param=param, code=code), status)


def _boltrl_error(e: BoltrlError) -> Response:
    if isinstance(e, RequestError):
        return _error(400, str(e), param=e.param, code=e.error_code)
    return _error(e.status_code, str(e), code=e.code)


class _API:
    """One API shape: how to parse its body and render its answers."""

    def __init__(
        self,
        prefix: str,
        parse: Callable[[JSON], ParsedCall],
        render: Callable[[str, int, str, Generation, ParsedCall], JSON],
        stream: Callable[[str, int, str, Generation, ParsedCall], bytes],
        live: Callable[[str, int, str, ParsedCall], _live.LiveWriter],
    ) -> None:
        self.prefix, self.parse, self.render, self.stream = prefix, parse, render, stream
        self.live = live


_CHAT = _API("chatcmpl-", chat.parse, chat.completion, chat.stream, _live.ChatLive)
_RESPONSES = _API(
    "resp_", responses.parse, responses.response, responses.stream, _live.ResponsesLive
)


class _Handlers:
    def __init__(
        self, backend: Backend, store: Store | None, sessions: SessionConfig | None
    ) -> None:
        self.backend = backend
        self.recorder = Recorder(store) if store is not None else None
        self.sessions = Sessions(store, sessions) if sessions is not None else None

    async def serve(self, request: Request, api: _API) -> Response:
        """One call: parse → attempt → generate → record → respond."""
        params = request.path_params
        rollout_id: str | None = params.get("rollout_id")
        try:
            session = Sessions.of(request, self.sessions is not None)
            if session is not None:
                rollout_id = session_rollout_id(session)
            call = api.parse(read_body(await request.body()))
            call.request.rollout_id = rollout_id
            if session is not None:
                assert self.sessions is not None
                attempt: Attempt | None = await self.sessions.attempt(session)
            else:
                attempt = await self._attempt(rollout_id, params.get("number"), params.get("token"))
        except BoltrlError as e:
            return _boltrl_error(e)
        call_id = api.prefix + uuid.uuid4().hex
        started = time.time()
        if _live.streams_live(self.backend, call):
            return await self._serve_live(api, call, call_id, attempt, started, session)
        try:
            gen = check_generation(await self.backend.generate(call.request))
        except Exception as e:
            return await self._failed(call_id, attempt, call, e, started)
        ended = time.time()
        model = gen.model or self.backend.model_name
        if attempt is not None:
            assert self.recorder is not None
            try:
                await self.recorder.served(
                    call_id,
                    attempt,
                    call,
                    gen,
                    model=model,
                    policy_version=self.backend.policy_version,
                    started_at=started,
                    ended_at=ended,
                )
            except BoltrlError as e:
                return _boltrl_error(e)
            if session is not None:
                assert self.sessions is not None
                await self.sessions.called(session)
        created = int(ended)
        if call.stream:
            body = api.stream(call_id, created, model, gen, call)
            return Response(body, 200, headers=_SSE_HEADERS, media_type="text/event-stream")
        return _json(api.render(call_id, created, model, gen, call))

    async def _serve_live(
        self,
        api: _API,
        call: ParsedCall,
        call_id: str,
        attempt: Attempt | None,
        started: float,
        session: str | None,
    ) -> Response:
        """A streamed call whose text leaves as it is sampled (``gateway._live``)."""
        created, model = int(started), self.backend.model_name

        async def record(gen: Generation, ended: float) -> None:
            if attempt is not None:
                assert self.recorder is not None
                await self.recorder.served(
                    call_id,
                    attempt,
                    call,
                    gen,
                    model=gen.model or model,
                    policy_version=self.backend.policy_version,
                    started_at=started,
                    ended_at=ended,
                )
                if session is not None and self.sessions is not None:
                    await self.sessions.called(session)

        async def failed(e: Exception) -> Response:
            return await self._failed(call_id, attempt, call, e, started)

        return await _live.serve(
            stream_of(self.backend, call.request),
            api.live(call_id, created, model, call),
            lambda gen: api.stream(call_id, created, model, gen, call),
            record=record,
            failed=failed,
            refused=_boltrl_error,
        )

    async def _attempt(
        self, rollout_id: str | None, number: int | None, token: str | None
    ) -> Attempt | None:
        """The attempt to record under; None when the call is not recorded."""
        if rollout_id is None or self.recorder is None:
            return None
        return await self.recorder.attempt(rollout_id, number, token)

    async def _failed(
        self, call_id: str, attempt: Attempt | None, call: ParsedCall, e: Exception, started: float
    ) -> Response:
        """Record the backend's failure (when recording) and tell the agent: 502 or 503."""
        log.warning("gateway: backend failed on %s: %s: %s", call_id, type(e).__name__, e)
        if attempt is not None and self.recorder is not None:
            await self.recorder.failed(
                call_id,
                attempt,
                call,
                e,
                model=self.backend.model_name,
                started_at=started,
                ended_at=time.time(),
            )
        if isinstance(e, BackendUnavailable):
            return _error(503, f"backend unavailable: {e}", code=e.code)
        return _error(502, f"backend error: {type(e).__name__}: {e}", code="backend_error")

    async def chat(self, request: Request) -> Response:
        return await self.serve(request, _CHAT)

    async def responses(self, request: Request) -> Response:
        return await self.serve(request, _RESPONSES)

    def _model(self) -> JSON:
        return {
            "id": self.backend.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "boltrl",
        }

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.backend.model_name:
            return _error(
                404, f"The model {name!r} does not exist", param="model", code="model_not_found"
            )
        return _json(self._model())

    async def feedback(self, request: Request) -> Response:
        assert self.sessions is not None
        try:
            return await self.sessions.feedback(request)
        except BoltrlError as e:
            return _boltrl_error(e)

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok", "model": self.backend.model_name})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return _error(exc.status_code, message, code=code)


def _refusal(e: BoltrlError) -> Response:
    """A request the serving guard refused, in OpenAI's error shape."""
    if isinstance(e, Unauthorized):
        return _error(
            401, "Incorrect API key provided for the boltrl gateway.", code="invalid_api_key"
        )
    return _error(e.status_code, str(e), code=e.code)


def create_gateway_app(
    backend: Backend,
    store: Store | None = None,
    *,
    token: str | None = None,
    allowed_hosts: Collection[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    sessions: SessionConfig | None = None,
) -> FastAPI:
    """The gateway as an ASGI app (mount it anywhere; ``Gateway`` serves it standalone).

    ``store`` None serves rollout routes without recording them (the rollout id still
    reaches the backend). ``token``, when set, is required as ``Authorization: Bearer``
    (OpenAI clients send their ``api_key`` that way) on every route but ``/health``.
    ``allowed_hosts``, when set, are the only ``Host`` names served. POSTs must say
    ``Content-Type: application/json`` (415: a web page's cross-site form cannot) and
    carry at most ``max_body_bytes`` (413); see ``boltrl._serving.Guard``. A body holding
    what a record could not read back (NaN, integers beyond int64, nesting deeper than
    ``store._checks.MAX_DEPTH``) gets a 400 naming the field, before the backend is
    called; a backend answer a record cannot hold (a NaN or -inf logprob) fails the call
    with a 502, recorded ``failed``. Neither the backend nor the store is closed by the
    app.

    ``sessions``, when set, adds the session routes (``gateway.sessions``); the store must
    then keep sessions (``SessionStore``: memory, SQLite, HTTP), else ``InvalidInput``.
    Without it a call naming a session (the ``X-Boltrl-Session`` header) gets a 400.
    """
    check_token("token", token)  # at once: middleware is built on the first request
    h = _Handlers(backend, store, sessions)
    app = FastAPI(title="boltrl gateway", openapi_url=None, docs_url=None, redoc_url=None)
    app.add_exception_handler(HTTPException, _http_error)
    prefixes = [
        "/rollouts/{rollout_id}/attempts/{number:int}/{token}/v1",
        "/rollouts/{rollout_id}/v1",
        "/v1",
    ]
    if sessions is not None:
        prefixes.append("/sessions/{session_id}/v1")
        app.add_route("/sessions/{session_id}/feedback", h.feedback, methods=["POST"])
    for prefix in prefixes:
        app.add_route(f"{prefix}/chat/completions", h.chat, methods=["POST"])
        app.add_route(f"{prefix}/responses", h.responses, methods=["POST"])
        app.add_route(f"{prefix}/models", h.models, methods=["GET"])
        app.add_route(f"{prefix}/models/{{model:path}}", h.model, methods=["GET"])
    app.add_route("/health", h.health, methods=["GET"])
    app.add_middleware(
        Guard,
        reject=_refusal,
        token=token,
        protected=lambda path: path != "/health",
        allowed_hosts=allowed_hosts,
        json_only=True,
        max_body_bytes=max_body_bytes,
    )
    app.state.backend = backend
    app.state.store = store
    app.state.sessions_store = h.sessions.store if h.sessions is not None else None
    return app
