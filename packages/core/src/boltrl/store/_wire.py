"""Request and response bodies of the store's HTTP API (shared by server and client).

The bodies carry the records of ``boltrl.records`` unchanged; these models only wrap
them. Argument checks stay in the engine, so a bad value gets the same error over HTTP
as in process. Non-finite floats travel as the JSON extensions ``NaN``/``Infinity``
rather than ``null``, so that a NaN reward reaches the server's check instead of turning
silently into "no reward".
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter

from boltrl._serving import SERVING_ERRORS
from boltrl.errors import ERRORS_BY_CODE, BoltrlError
from boltrl.records import Attempt, Rollout, Task

PREFIX = "/store"
"""Every store route lives under this prefix, so a gateway or dashboard can share the app."""

MAX_POLL_S = 20.0
"""Longest a single long-poll request blocks on the server; clients loop for longer waits."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class EnqueueRequest(_Wire):
    tasks: list[Any]
    max_attempts: Any = 3
    timeout_s: Any = None


class Ids(_Wire):
    ids: list[str]


class ClaimRequest(_Wire):
    worker_id: Any
    lease_s: Any
    wait_s: Any = 0.0


class HeartbeatRequest(_Wire):
    attempt: Attempt
    lease_s: Any = None


class RecordItem(_Wire):
    attempt: Attempt
    records: list[Any]
    """Validated by the engine one by one, so an error names ``records[i].field``."""


class RecordBatch(_Wire):
    items: list[RecordItem]


class ErrorBody(_Wire):
    code: str
    message: str


class RecordResults(_Wire):
    results: list[ErrorBody | None]
    """One entry per item: None when stored, else why it was refused (nothing stored)."""


class FinishRequest(_Wire):
    attempt: Attempt
    status: Any
    reward: Any = None
    error: Any = None
    error_kind: Any = None
    retryable: bool = False


class WaitRequest(_Wire):
    ids: list[Any]
    timeout_s: Any


class Count(_Wire):
    count: int


class TouchSessionRequest(_Wire):
    session_id: Any
    feedback_timeout_s: Any
    metadata: Any = None


class FeedbackRequest(_Wire):
    session_id: Any
    reward: Any
    name: Any = None


ROLLOUTS: TypeAdapter[list[Rollout]] = TypeAdapter(list[Rollout])
OPTIONAL_ATTEMPT: TypeAdapter[Attempt | None] = TypeAdapter(Attempt | None)
TASKS: TypeAdapter[list[Task]] = TypeAdapter(list[Task])


def error_body(e: BoltrlError) -> dict[str, Any]:
    return {"error": {"code": e.code, "message": str(e)}}


_BY_CODE = {**ERRORS_BY_CODE, **{cls.code: cls for cls in SERVING_ERRORS}}


def error_from(code: str, message: str) -> BoltrlError:
    """The exception a client raises for a server error: the same class as in process
    (and the serving guard's own for a refused Host, content type or body size)."""
    return _BY_CODE.get(code, BoltrlError)(message)
