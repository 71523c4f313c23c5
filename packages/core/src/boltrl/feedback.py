"""Send a session's feedback to a boltrl gateway, from any process or machine.

A deployed agent's conversation is a session (``boltrl.gateway.sessions``); whoever learns
how it went — the user's thumbs-up an hour later, a ticket closed next day, a grader —
rewards it with::

    from boltrl.feedback import send_feedback
    send_feedback("http://gateway:8000", "conv-42", 1.0, name="thumbs")

That is ``POST {base_url}/sessions/{session_id}/feedback`` with ``{"reward": 1.0,
"name": "thumbs"}``; any HTTP client can send it. The session is then closed and its
rollout carries the reward as its return. Refusals raise the error the gateway named:
``InvalidInput`` (400: a malformed id or a reward that is not a finite number — checked
here before sending), ``Unauthorized`` (401), ``NotFound`` (404: unknown session),
``SessionClosed`` (409: it already received feedback), ``SessionExpired`` (410: its
deadline passed), ``StoreUnavailable`` (the gateway could not be reached or failed).

No retries: a feedback sent twice is refused (409), so after a lost answer, send it again
and read a 409 as "the first one arrived".
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from boltrl import _http
from boltrl._serving import check_token
from boltrl.errors import (
    ERRORS_BY_CODE,
    BoltrlError,
    InvalidInput,
    NotFound,
    SessionClosed,
    SessionExpired,
    StoreUnavailable,
    Unauthorized,
)
from boltrl.store._sessions import check_feedback, check_session_id

__all__ = ["Feedback", "send_feedback"]

log = logging.getLogger(__name__)

_BY_STATUS: dict[int, type[BoltrlError]] = {
    400: InvalidInput,
    401: Unauthorized,
    404: NotFound,
    409: SessionClosed,
    410: SessionExpired,
}
_SESSION_SUFFIX = re.compile(r"(/sessions/[^/]+)?(/v1)?/*$")


@dataclass(frozen=True)
class Feedback:
    """The gateway's answer to a feedback it stored."""

    session_id: str
    rollout_id: str
    """The session's rollout (``boltrl.store.session_rollout_id``)."""
    status: str
    """``succeeded``: the session is closed and rewarded."""
    reward: float
    name: str


def send_feedback(
    base_url: str,
    session_id: str,
    reward: float,
    name: str | None = None,
    *,
    token: str | None = None,
    timeout_s: float = 30.0,
) -> Feedback:
    """Reward session ``session_id`` on the gateway at ``base_url`` and close it.

    ``base_url`` is the gateway's root (``http://host:port``); the session's own OpenAI
    base URL (``…/sessions/{id}/v1``) or ``…/v1`` are accepted too. ``token`` is the
    gateway's bearer token, when it has one. Blocks for one round trip (at most
    ``timeout_s``); raises as the module docstring says.
    """
    session_id = check_session_id(session_id)
    value, label = check_feedback(reward, name)
    check_token("token", token)
    root = _root(base_url)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        pool = _http.SyncPool(
            root,
            headers,
            timeout_s=timeout_s,
            connect_timeout_s=min(timeout_s, 10.0),
            max_idle=0,
            user_agent="boltrl-feedback",
        )
    except ValueError as e:
        raise InvalidInput(f"base_url: {e}") from None
    body = json.dumps({"reward": value, "name": label}).encode()
    try:
        resp = pool.request(
            "POST",
            f"/sessions/{session_id}/feedback",
            body,
            headers={"content-type": "application/json"},
        )
    except _http.TransportError as e:
        raise StoreUnavailable(f"could not reach the gateway at {root}: {e}") from e
    finally:
        pool.close()
    if resp.status_code >= 400:
        raise _error_of(resp.status_code, resp.content)
    answer = json.loads(resp.content)
    log.debug("feedback %s for session %s stored", value, session_id)
    return Feedback(
        session_id=answer["session_id"],
        rollout_id=answer["rollout_id"],
        status=answer["status"],
        reward=float(answer["reward"]),
        name=answer["name"],
    )


def _root(base_url: str) -> str:
    if not isinstance(base_url, str):
        raise InvalidInput(f"base_url: expected a URL string, got {type(base_url).__name__}")
    url = urlsplit(base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise InvalidInput(f"base_url: expected http(s)://host:port, got {base_url!r}")
    path = _SESSION_SUFFIX.sub("", url.path)
    return f"{url.scheme}://{url.netloc}{path}"


def _error_of(status: int, content: bytes) -> BoltrlError:
    """The error a refusal names (by its ``code``, else by its status)."""
    message, code = f"HTTP {status}", None
    try:
        err = json.loads(content)["error"]
        message, code = str(err.get("message") or message), err.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message = content.decode(errors="replace")[:500] or message
    cls = ERRORS_BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None or cls is BoltrlError:
        cls = _BY_STATUS.get(status, StoreUnavailable if status >= 500 else InvalidInput)
    return cls(message)
