"""The store over HTTP, client side: ``open_store("http://host:port", token=...)``.

- **Same errors.** Server errors come back as the exception classes of
  ``boltrl.errors`` (by the ``code`` in the JSON body), so callers cannot tell this store
  from an in-process one by its errors.
- **Retries.** Connection errors and 5xx answers are retried with exponential backoff
  and jitter (``retries`` times); then ``StoreUnavailable``. Mutating calls carry an
  ``Idempotency-Key`` that stays the same across retries, so a retry after a lost answer
  gets the original answer instead of enqueueing twice or finishing a finished attempt.
- **Batched records (group commit).** ``record`` hands its records to one background
  sender and blocks until the batch they travel in is acknowledged: a single caller
  pays one round trip per call, many concurrent callers share round trips. ``record``
  never returns before its records are durable on the server.
- **Transport.** boltrl's small HTTP/1.1 client (``boltrl._http.SyncPool``, shared
  with the gateway's upstream): keep-alive connections shared by all threads, a
  fraction of httpx's CPU per request. It honors no proxy settings: a store is reached
  directly.
- **Long-polls.** ``claim`` and ``wait`` block on the server in slices of at most
  ``MAX_POLL_S``, looping until their own timeout.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, TypeAdapter

from boltrl import _http
from boltrl._serving import check_token
from boltrl.errors import BoltrlError, InvalidInput, NotFound, StoreUnavailable
from boltrl.records import JSON, AnyRecord, Attempt, Resources, Rollout, RolloutStatus, Task
from boltrl.store import _wire as w
from boltrl.store._checks import check_number, check_readable, check_tasks
from boltrl.store._engine import WorkerInfo
from boltrl.store._sessions import check_feedback, check_session_id
from boltrl.store.base import DEFAULT_FEEDBACK_TIMEOUT_S, DEFAULT_LEASE_S, SessionPage

log = logging.getLogger(__name__)

_ANY_LIST: TypeAdapter[list[Any]] = TypeAdapter(list[Any])
_WORKERS: TypeAdapter[list[WorkerInfo]] = TypeAdapter(list[WorkerInfo])
_RETRY_STATUS = (500, 502, 503, 504)
_MAX_BATCH_BYTES = 8 * 2**20


class HttpStore:
    """A ``Store`` served by ``boltrl store serve`` (or ``create_store_app``) elsewhere;
    a ``SessionStore`` too when the served store is one (memory, SQLite).

    Thread-safe: share one instance between threads. ``close()`` sends what is batched
    and releases connections.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 6,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        max_batch: int = 512,
    ) -> None:
        check_token("token", token)
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_s
        try:
            self._http = _http.SyncPool(
                self.url + w.PREFIX,
                headers,
                timeout_s=timeout_s,
                connect_timeout_s=min(timeout_s, 10.0),
                max_idle=64,
                user_agent="boltrl-store-client",
            )
        except ValueError as e:
            raise InvalidInput(f"url: {e}") from None
        self._batch = _RecordBatcher(self, max_batch)
        self._closed = False

    # -- transport --------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        once: bool = False,
    ) -> bytes:
        """Send with retries; return the body of a 2xx answer or raise the mapped error."""
        if self._closed:
            raise StoreUnavailable("the store client is closed")
        # Every POST says JSON, bodiless ones too: the server refuses any other (a web
        # page's cross-site form could send those).
        headers = {"content-type": "application/json"} if method != "GET" else {}
        if once:
            headers["idempotency-key"] = uuid.uuid4().hex
        if params:
            path += "?" + urllib.parse.urlencode(params)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                resp = self._http.request(method, path, body, headers=headers, timeout_s=timeout_s)
            except _http.TransportError as e:
                if last:
                    raise StoreUnavailable(f"could not reach the store at {self.url}: {e}") from e
                log.debug("store request %s %s failed (%s); retrying", method, path, e)
                self._sleep(attempt)
                continue
            if resp.status_code in _RETRY_STATUS and not last:
                self._sleep(attempt)
                continue
            if resp.status_code >= 400:
                raise _error_of(resp)
            return resp.content
        raise AssertionError("unreachable")  # pragma: no cover

    def _sleep(self, attempt: int) -> None:
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        time.sleep(delay * (0.5 + random.random() / 2))

    # -- the Store API ------------------------------------------------------------------------

    def enqueue(
        self, tasks: Sequence[Task], *, max_attempts: int = 3, timeout_s: float | None = None
    ) -> list[str]:
        # Checked here as the server would: a NaN inside a task would travel as null.
        checked = check_tasks(tasks)
        req = w.EnqueueRequest(tasks=checked, max_attempts=max_attempts, timeout_s=timeout_s)
        body = self._request("POST", "/rollouts", body=req.model_dump_json().encode(), once=True)
        return w.Ids.model_validate_json(body).ids

    def claim(
        self, worker_id: str, *, lease_s: float = DEFAULT_LEASE_S, wait_s: float = 0.0
    ) -> Attempt | None:
        wait_s = check_number("wait_s", wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), w.MAX_POLL_S)
            req = w.ClaimRequest(worker_id=worker_id, lease_s=lease_s, wait_s=chunk)
            body = self._request(
                "POST",
                "/claim",
                body=req.model_dump_json().encode(),
                timeout_s=chunk + self._timeout_s,
                once=True,
            )
            att = w.OPTIONAL_ATTEMPT.validate_json(body)
            if att is not None or time.monotonic() >= deadline:
                return att

    def heartbeat(self, attempt: Attempt, *, lease_s: float | None = None) -> Attempt:
        req = w.HeartbeatRequest(attempt=_bare(attempt), lease_s=lease_s)
        body = self._request("POST", "/heartbeat", body=req.model_dump_json().encode())
        beat = Attempt.model_validate_json(body)
        return beat.model_copy(update={"task": attempt.task, "timeout_s": attempt.timeout_s})

    def record(self, attempt: Attempt, records: Sequence[AnyRecord]) -> None:
        if not isinstance(attempt, Attempt):
            raise InvalidInput(f"attempt: expected an Attempt, got {type(attempt).__name__}")
        if isinstance(records, str | bytes) or not isinstance(records, Sequence):
            raise InvalidInput(f"records: expected a list of records, got {type(records).__name__}")
        for i, r in enumerate(records):  # as the server would, before the round trip
            if isinstance(r, BaseModel):
                check_readable(f"records[{i}]", r)
        # Serialized here, in the caller's thread: the sender only concatenates.
        item = (
            b'{"attempt":'
            + _bare(attempt).model_dump_json().encode()
            + b',"records":'
            + _ANY_LIST.dump_json(list(records))
            + b"}"
        )
        self._batch.submit(item).result()

    def _send_records(self, items: list[bytes]) -> list[BoltrlError | None]:
        body = b'{"items":[' + b",".join(items) + b"]}"
        results = w.RecordResults.model_validate_json(
            self._request("POST", "/records", body=body)
        ).results
        return [None if r is None else w.error_from(r.code, r.message) for r in results]

    def current_attempt(self, rollout_id: str) -> Attempt:
        body = self._request("GET", f"/rollouts/{_seg(rollout_id)}/current_attempt")
        return Attempt.model_validate_json(body)

    def finish(
        self,
        attempt: Attempt,
        status: RolloutStatus | str,
        *,
        reward: float | None = None,
        error: str | None = None,
        error_kind: str | None = None,
        retryable: bool = False,
    ) -> Rollout:
        for name, val in (("error", error), ("error_kind", error_kind)):
            if isinstance(val, str):
                check_readable(name, val)  # a lone surrogate cannot be sent as UTF-8
        req = w.FinishRequest(
            attempt=_bare(attempt),
            status=status,
            reward=reward,
            error=error,
            error_kind=error_kind,
            retryable=retryable,
        )
        body = self._request("POST", "/finish", body=req.model_dump_json().encode(), once=True)
        return Rollout.model_validate_json(body)

    def cancel(self, rollout_id: str) -> Rollout:
        body = self._request("POST", f"/rollouts/{_seg(rollout_id)}/cancel", once=True)
        return Rollout.model_validate_json(body)

    def get(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate_json(self._request("GET", f"/rollouts/{_seg(rollout_id)}"))

    def query(
        self, *, status: RolloutStatus | str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status is not None:
            params["status"] = str(status)
        return w.ROLLOUTS.validate_json(self._request("GET", "/rollouts", params=params))

    def count(self, *, status: RolloutStatus | str | None = None) -> int:
        params = {} if status is None else {"status": str(status)}
        return w.Count.model_validate_json(self._request("GET", "/count", params=params)).count

    def wait(self, rollout_ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        if isinstance(rollout_ids, str) or not isinstance(rollout_ids, Sequence):
            raise InvalidInput("rollout_ids: expected a list of rollout ids")
        timeout_s = check_number("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), w.MAX_POLL_S)
            req = w.WaitRequest(ids=list(rollout_ids), timeout_s=chunk)
            body = self._request(
                "POST",
                "/wait",
                body=req.model_dump_json().encode(),
                timeout_s=chunk + self._timeout_s,
            )
            found = w.ROLLOUTS.validate_json(body)
            if all(r.status.terminal for r in found) or time.monotonic() >= deadline:
                return found

    def publish_resources(self, resources: Resources) -> Resources:
        if not isinstance(resources, Resources):
            raise InvalidInput(f"resources: expected Resources, got {type(resources).__name__}")
        check_readable("resources", resources)  # JSON would carry a NaN as null
        body = self._request(
            "POST", "/resources", body=resources.model_dump_json().encode(), once=True
        )
        return Resources.model_validate_json(body)

    def resources(self) -> Resources:
        return Resources.model_validate_json(self._request("GET", "/resources"))

    # -- the SessionStore API ---------------------------------------------------------------

    def touch_session(
        self,
        session_id: str,
        *,
        feedback_timeout_s: float = DEFAULT_FEEDBACK_TIMEOUT_S,
        metadata: JSON | None = None,
    ) -> Attempt:
        if metadata is not None:
            check_readable("metadata", metadata)
        req = w.TouchSessionRequest(
            session_id=check_session_id(session_id),
            feedback_timeout_s=feedback_timeout_s,
            metadata=metadata,
        )
        body = self._request("POST", "/sessions/touch", body=req.model_dump_json().encode())
        return Attempt.model_validate_json(body)

    def feedback(self, session_id: str, reward: float, *, name: str | None = None) -> Rollout:
        value, label = check_feedback(reward, name)  # a NaN must not travel as null
        req = w.FeedbackRequest(session_id=check_session_id(session_id), reward=value, name=label)
        body = self._request(
            "POST", "/sessions/feedback", body=req.model_dump_json().encode(), once=True
        )
        return Rollout.model_validate_json(body)

    def rewarded_sessions(self, *, after: int = 0, limit: int = 100) -> SessionPage:
        params = {"after": after, "limit": limit}
        return SessionPage.model_validate_json(
            self._request("GET", "/sessions/rewarded", params=params)
        )

    def expire_sessions(self) -> int:
        return w.Count.model_validate_json(self._request("POST", "/sessions/expire")).count

    def workers(self) -> list[WorkerInfo]:
        """Workers the server's store has seen (see ``StoreEngine.workers``)."""
        return _WORKERS.validate_json(self._request("GET", "/workers"))

    def close(self) -> None:
        if self._closed:
            return
        self._batch.close()
        self._closed = True
        self._http.close()

    def __enter__(self) -> HttpStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RecordBatcher:
    """Group commit for ``record``: one sender thread, one batch in flight at a time.

    Callers append their serialized item and wait on its future; the sender takes
    everything pending (up to ``max_batch`` items and 8 MiB) as one request and resolves each
    future with that item's own result.
    """

    def __init__(self, client: HttpStore, max_batch: int) -> None:
        self._client = client
        self._max = max_batch
        self._cond = threading.Condition()
        self._pending: list[tuple[bytes, Future[None]]] = []
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, item: bytes) -> Future[None]:
        fut: Future[None] = Future()
        with self._cond:
            if self._closing:
                raise StoreUnavailable("the store client is closed")
            self._pending.append((item, fut))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="boltrl-store-records", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                n = _batch_size(self._pending, self._max)
                batch, self._pending = self._pending[:n], self._pending[n:]
            try:
                results = self._client._send_records([item for item, _ in batch])
            except BaseException as e:  # every caller of the batch sees the failure
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            for (_, fut), err in zip(batch, results, strict=True):
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()


def _batch_size(pending: list[tuple[bytes, Future[None]]], most: int) -> int:
    """How many of the first pending items one request carries: at most ``most``, and no
    more than ``_MAX_BATCH_BYTES`` of them (at least one), so a batch of large records
    stays under the server's body limit."""
    n = size = 0
    for item, _ in pending[:most]:
        size += len(item)
        if n and size > _MAX_BATCH_BYTES:
            break
        n += 1
    return n


def _bare(attempt: Attempt) -> Attempt:
    """The attempt without its task: the server knows the task; don't resend it."""
    if not isinstance(attempt, Attempt):
        raise InvalidInput(f"attempt: expected an Attempt, got {type(attempt).__name__}")
    return attempt.model_copy(update={"task": None}) if attempt.task is not None else attempt


def _seg(rollout_id: str) -> str:
    """The id as one URL path segment, with the in-process store's errors for odd ones."""
    if not isinstance(rollout_id, str):
        raise InvalidInput(f"rollout_id: expected a string, got {type(rollout_id).__name__}")
    if not rollout_id:
        raise NotFound(f"unknown rollout {rollout_id!r}")
    return urllib.parse.quote(rollout_id, safe="")


def _error_of(resp: _http.Response) -> BoltrlError:
    try:
        err = json.loads(resp.content)["error"]
        return w.error_from(str(err["code"]), str(err["message"]))
    except (ValueError, KeyError, TypeError):
        text = resp.text[:300]
        return BoltrlError(f"store answered HTTP {resp.status_code}: {text}")
