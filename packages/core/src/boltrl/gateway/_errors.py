"""OpenAI-style error bodies, and the request error that names the offending field."""

from __future__ import annotations

from typing import Any

from boltrl.errors import InvalidInput

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    502: "server_error",
    503: "server_error",
}


class RequestError(InvalidInput):
    """A malformed request body; ``param`` is the offending field's path (``messages[2].role``).

    Raised before anything is generated or recorded, so a bad request changes nothing.
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.error_code = code


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body OpenAI's API (and so every OpenAI client) expects with a non-2xx status."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }
