"""Sessions on the gateway: a deployed agent's conversations, recorded, then rewarded later.

A gateway created with ``sessions=SessionConfig(...)`` also serves, beside the attempt
routes the training loop uses:

- ``/sessions/{session_id}/v1/...`` — the OpenAI routes (``chat/completions``,
  ``responses``, ``models``): the agent's ``base_url`` is
  ``http://HOST:PORT/sessions/{session_id}/v1`` and its code changes in nothing else;
- the plain ``/v1/...`` routes with the header ``X-Boltrl-Session: {session_id}`` (for
  clients whose base URL is fixed); a URL session and a different header is a 400;
- ``POST /sessions/{session_id}/feedback`` with ``{"reward": number, "name": "..."}``
  (``name`` optional): rewards and closes the session (``boltrl.feedback.send_feedback``
  sends it from any process or machine).

Session ids are chosen by the client and must match ``[A-Za-z0-9._:-]{1,128}`` (400
naming the rule). The first call of an unknown id opens the session's rollout (see
``boltrl.store.base.SessionStore``), later calls append to it; each call is recorded like
any recorded call (exact token ids, logprobs, policy version) and moves the session's
feedback deadline to ``feedback_timeout_s`` after it. Serving a session needs no lease
token — it is not a runner's attempt — but the gateway's guard still applies (Host
allow-list, bearer token when set). Feedback errors are 4xx naming the problem, with
nothing written: unknown session 404; a reward that is not a finite number 400 (the
gateway's status for every malformed body); feedback twice 409; after the deadline 410.
A call to a session that is closed gets 409 (rewarded) or 410 (expired). Feedback that
lands while one of the session's calls is being generated closes the session first: that
call is answered 409 and not recorded.

A session with no feedback by its deadline is closed ``cancelled`` / ``no_feedback``, has
no score and is never listed for training. The store enforces the deadline on every call
it serves; ``Gateway`` also sweeps every ``sweep_interval_s`` (``Sweeper``) so expired
sessions show as such without waiting for traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from boltrl.errors import BoltrlError, InvalidInput, StoreUnavailable
from boltrl.gateway._errors import RequestError
from boltrl.gateway._json import dumps
from boltrl.records import Attempt
from boltrl.store._checks import check_number
from boltrl.store._sessions import check_feedback, check_session_id
from boltrl.store.base import DEFAULT_FEEDBACK_TIMEOUT_S, SessionStore, Store

__all__ = ["SESSION_HEADER", "SessionConfig", "Sessions", "Sweeper"]

log = logging.getLogger(__name__)
T = TypeVar("T")

SESSION_HEADER = "X-Boltrl-Session"
"""The header naming a call's session on the plain ``/v1`` routes."""
_FEEDBACK_FIELDS = ("reward", "name")


@dataclass(frozen=True)
class SessionConfig:
    """How a gateway serves sessions."""

    feedback_timeout_s: float = DEFAULT_FEEDBACK_TIMEOUT_S
    """Seconds after a session's last call by which its feedback must arrive; later, the
    session is expired (never trained on) and its feedback refused with a 410."""
    sweep_interval_s: float = 30.0
    """How often ``Gateway`` closes the sessions past their deadline (the store also does
    it lazily on every call, so this only bounds how long an expired session looks open)."""

    def __post_init__(self) -> None:
        check_number("sessions.feedback_timeout_s", self.feedback_timeout_s, strict=True)
        check_number("sessions.sweep_interval_s", self.sweep_interval_s, strict=True)


def _session_store(store: Store | None) -> SessionStore:
    if store is None or not isinstance(store, SessionStore):
        kind = "no store" if store is None else type(store).__name__
        raise InvalidInput(
            f"sessions: need a store that keeps sessions (memory, SQLite or HTTP), got {kind}"
        )
    return store


class Sessions:
    """The gateway's side of sessions: which session a request names, its attempt, and
    the feedback route. Store calls run on worker threads, never on the event loop."""

    def __init__(self, store: Store | None, config: SessionConfig) -> None:
        self.store = _session_store(store)
        self.config = config

    @staticmethod
    def of(request: Request, enabled: bool) -> str | None:
        """The session a call names (URL or header), None for none; RequestError (400)
        for a malformed id, a header that contradicts the URL, a session header on an
        attempt route, or any session on a gateway that does not serve them."""
        in_url: str | None = request.path_params.get("session_id")
        header = request.headers.get(SESSION_HEADER)
        if header is None:
            session = in_url
        elif in_url is not None and header != in_url:
            raise RequestError(
                f"the {SESSION_HEADER} header names session {header[:140]!r} but the URL names "
                f"{in_url!r}; send one, or the same in both",
                None,
                "session_mismatch",
            )
        elif "rollout_id" in request.path_params:
            raise RequestError(
                f"{SESSION_HEADER} cannot be sent to a rollout's route; use /v1 or "
                "/sessions/{session_id}/v1",
                None,
                "session_on_rollout_route",
            )
        else:
            session = header
        if session is None:
            return None
        if not enabled:
            raise RequestError(
                f"this gateway does not serve sessions (the {SESSION_HEADER} header was sent); "
                "start it with sessions enabled",
                None,
                "sessions_disabled",
            )
        try:
            return check_session_id(session)
        except InvalidInput as e:
            raise RequestError(str(e), "session_id", "invalid_session_id") from None

    async def attempt(self, session_id: str) -> Attempt:
        """The session's attempt to record a call under (the session opened if new, its
        deadline moved); raises the store's refusal (409/410) or StoreUnavailable."""
        return await _store_call(
            self.store.touch_session,
            session_id,
            feedback_timeout_s=self.config.feedback_timeout_s,
        )

    async def called(self, session_id: str) -> None:
        """Move the deadline again once a call is recorded (a long generation must not
        eat into the user's time to answer). A session closed meanwhile is left so."""
        try:
            await self.attempt(session_id)
        except BoltrlError as e:
            log.info("gateway: session %s not extended after its call: %s", session_id, e)

    async def feedback(self, request: Request) -> Response:
        """``POST /sessions/{session_id}/feedback``: reward and close the session. Raises
        what the client is told instead (a ``BoltrlError``: 400, 404, 409, 410, 503)."""
        try:
            session_id = check_session_id(request.path_params["session_id"])
        except InvalidInput as e:
            raise RequestError(str(e), "session_id", "invalid_session_id") from None
        body = _feedback_body(await request.body())
        unknown = sorted(set(body) - set(_FEEDBACK_FIELDS))
        if unknown:
            raise RequestError(
                f"unknown field(s) {', '.join(map(repr, unknown))}; a feedback takes "
                '{"reward": number, "name": optional string}',
                unknown[0],
                "unknown_parameter",
            )
        if "reward" not in body:
            raise RequestError('reward: required ({"reward": number})', "reward", "missing")
        try:
            reward, name = check_feedback(body["reward"], body.get("name"))
        except InvalidInput as e:
            raise RequestError(str(e), str(e).split(":", 1)[0]) from None
        rollout = await _store_call(self.store.feedback, session_id, reward, name=name)
        answer = {
            "session_id": session_id,
            "rollout_id": rollout.id,
            "status": rollout.status.value,
            "reward": rollout.reward,
            "name": name,
        }
        return Response(dumps(answer), 200, media_type="application/json")


def _feedback_body(raw: bytes) -> dict[str, Any]:
    """The feedback body as a JSON object. Parsed by the stdlib, which reads ``NaN``,
    ``Infinity`` and ``1e999``, so that such a reward is refused by name (``reward: must
    be a finite number``) rather than as unreadable JSON."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}", None) from e
    if not isinstance(body, dict):
        raise RequestError('the request body must be a JSON object {"reward": number}', None)
    return body


async def _store_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A store call on a worker thread; anything but the store's own refusals becomes
    StoreUnavailable (503)."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except BoltrlError:
        raise
    except Exception as e:
        raise StoreUnavailable(f"the session store failed: {type(e).__name__}: {e}") from e


class Sweeper:
    """Closes expired sessions every ``interval_s`` on a daemon thread (``start``/``stop``).
    A failing sweep is logged and retried at the next tick."""

    def __init__(self, store: SessionStore, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="boltrl-sweeper", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                closed = self.store.expire_sessions()
            except Exception:
                log.exception("gateway: session sweep failed")
                continue
            if closed:
                log.info("gateway: %d session(s) expired without feedback", closed)

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(5.0)
