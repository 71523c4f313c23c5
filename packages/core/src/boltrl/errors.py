"""Errors boltrl raises. Each maps to one HTTP status on the store and gateway servers."""

from __future__ import annotations


class BoltrlError(Exception):
    """Base of all boltrl errors."""

    status_code: int = 500
    code: str = "internal_error"


class InvalidInput(BoltrlError, ValueError):
    """The caller sent something malformed (the message names the field)."""

    status_code = 400
    code = "invalid_input"


class Unauthorized(BoltrlError):
    """Missing or wrong token."""

    status_code = 401
    code = "unauthorized"


class NotFound(BoltrlError, KeyError):
    """Unknown rollout (or other id)."""

    status_code = 404
    code = "not_found"

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else "not found"


class Conflict(BoltrlError):
    """The request is well-formed but the state forbids it: finishing an attempt twice,
    a stale attempt acting after its lease was taken over, recording into a finished rollout."""

    status_code = 409
    code = "conflict"


class StaleAttempt(Conflict):
    """The attempt is no longer the rollout's current one (its lease expired and the
    rollout was requeued or re-claimed), or it already finished."""

    code = "stale_attempt"


class SessionClosed(Conflict):
    """The session already ended (its feedback arrived, or it was cancelled): no more
    calls or feedback are taken for it."""

    code = "session_closed"


class SessionExpired(BoltrlError):
    """The session's feedback deadline passed before any feedback arrived: it was closed
    as expired (never trained on), and feedback for it is refused."""

    status_code = 410
    code = "session_expired"


class BackendError(BoltrlError):
    """The model backend failed to serve a call."""

    status_code = 502
    code = "backend_error"


class BackendUnavailable(BackendError):
    """The model backend is not ready or overloaded."""

    status_code = 503
    code = "backend_unavailable"


class StoreUnavailable(BoltrlError):
    """The store could not be reached (after retries)."""

    status_code = 503
    code = "store_unavailable"


ERRORS_BY_CODE: dict[str, type[BoltrlError]] = {
    cls.code: cls
    for cls in (
        BoltrlError,
        InvalidInput,
        Unauthorized,
        NotFound,
        Conflict,
        StaleAttempt,
        SessionClosed,
        SessionExpired,
        BackendError,
        BackendUnavailable,
        StoreUnavailable,
    )
}
