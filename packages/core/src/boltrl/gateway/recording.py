"""Turning one served call into one ``LLMCall`` in the store.

The gateway writes a call before the agent sees the response, so what an agent has
seen is durable; a write that fails fails the request. Store methods are synchronous
(they may do I/O: SQLite commits, HTTP), so they run on worker threads, never on the
event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from boltrl.errors import (
    BackendError,
    BoltrlError,
    Conflict,
    NotFound,
    StaleAttempt,
    StoreUnavailable,
)
from boltrl.gateway._output import assistant_message, usage_of
from boltrl.gateway._request import ParsedCall
from boltrl.gateway.backend import Generation
from boltrl.records import Attempt, LLMCall
from boltrl.store._checks import find_unreadable
from boltrl.store.base import Store

log = logging.getLogger(__name__)

T = TypeVar("T")


class RolloutUnavailable(BoltrlError):
    """The rollout is unknown or not running: the agent gets a 404."""

    status_code = 404

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class AttemptRefused(BoltrlError):
    """The call names no attempt, or one that is not the rollout's current one: a 409,
    and nothing is recorded (fencing: an abandoned attempt's late calls never become
    another attempt's training data)."""

    status_code = 409

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _store_error(e: Exception, rollout_id: str) -> BoltrlError:
    """What the agent is told when the store refuses or fails."""
    if isinstance(e, StaleAttempt):
        return AttemptRefused(f"{e}; the call was not recorded", "stale_attempt")
    if isinstance(e, NotFound):
        return RolloutUnavailable(f"rollout {rollout_id!r} not found", "rollout_not_found")
    if isinstance(e, Conflict):
        return RolloutUnavailable(
            f"rollout {rollout_id!r} is not running ({e}); its calls can no longer be recorded",
            "rollout_not_running",
        )
    if isinstance(e, StoreUnavailable):
        return e
    return StoreUnavailable(f"could not record the call: {type(e).__name__}: {e}")


class Recorder:
    """Builds each served call's ``LLMCall`` and files it under the rollout's attempt.

    A call reads top to bottom: ``attempt`` (which attempt the call belongs to), then,
    after the backend answered, ``served`` or ``failed`` (build the record and write it).
    Store calls run on a small private thread pool (``threads`` workers): few threads
    keep GIL hand-offs cheap under many concurrent calls, while a store doing network or
    disk I/O still overlaps that many calls. Threads start on first use and end when the
    recorder is garbage-collected.
    """

    def __init__(self, store: Store, threads: int = 4) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="boltrl-gateway-store")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def attempt(
        self, rollout_id: str, number: int | None = None, token: str | None = None
    ) -> Attempt:
        """The attempt a call of ``rollout_id`` is recorded under: the running one, when
        it is the attempt ``number`` the call's route names; ``token`` (from the route)
        goes with it, and the store checks it when the call is written.

        Raises ``RolloutUnavailable`` (404), ``AttemptRefused`` (409: the route carries
        no attempt, or one that was replaced) or ``StoreUnavailable`` (503); nothing is
        generated for a call that has no attempt to record under.
        """
        try:
            current = await self._run(self.store.current_attempt, rollout_id)
        except Exception as e:
            raise _store_error(e, rollout_id) from e
        if number is None or not token:
            raise AttemptRefused(
                f"rollout {rollout_id!r}: /rollouts/{{id}}/v1 is not recorded; send calls to "
                "the base_url the runner hands the agent "
                "(/rollouts/{id}/attempts/{number}/{token}/v1)",
                "attempt_token_required",
            )
        if current.number != number:
            raise AttemptRefused(
                f"attempt {number} of rollout {rollout_id!r} is no longer current (attempt "
                f"{current.number} is); the call was not recorded",
                "stale_attempt",
            )
        return current.model_copy(update={"token": token})

    async def served(
        self,
        call_id: str,
        attempt: Attempt,
        call: ParsedCall,
        gen: Generation,
        *,
        model: str,
        policy_version: int | None,
        started_at: float,
        ended_at: float,
    ) -> None:
        """Record a served call durably (before the agent sees it).

        Raises what the agent should be told instead of the answer: ``BackendError``
        (502) when the generation cannot be held by a record, the store's refusal or
        ``StoreUnavailable`` when it cannot be written.
        """
        try:
            record = ok_call(
                call_id,
                attempt,
                call,
                gen,
                model=model,
                policy_version=policy_version,
                started_at=started_at,
                ended_at=ended_at,
            )
        except ValueError as e:  # the backend produced something a record cannot hold
            log.exception("gateway: call %s cannot be recorded", call_id)
            raise BackendError(f"backend returned an invalid generation: {e}") from e
        try:
            await self._run(self.store.record, attempt, [record])
        except Exception as e:
            log.warning("gateway: recording call %s failed: %s", call_id, e)
            raise _store_error(e, attempt.rollout_id) from e

    async def failed(
        self,
        call_id: str,
        attempt: Attempt,
        call: ParsedCall,
        error: BaseException,
        *,
        model: str,
        started_at: float,
        ended_at: float,
    ) -> None:
        """Record a call the backend failed; a store failure here is logged, not raised
        (the backend's error is what the agent is told)."""
        record = failed_call(
            call_id, attempt, call, error, model=model, started_at=started_at, ended_at=ended_at
        )
        try:
            await self._run(self.store.record, attempt, [record])
        except Exception:
            log.exception("gateway: could not record failed call %s", call_id)


def check_generation(gen: Generation) -> Generation:
    """``gen`` if a record can hold it, else ``BackendError`` (the call fails with a 502
    and is recorded ``failed``).

    A backend's NaN or -inf logprob is refused rather than clamped: it means the backend's
    numbers for that call cannot be trusted (an importance ratio against it is undefined),
    and clamping would put a made-up behaviour logprob into training data. The agent sees
    the backend error it would see for any backend fault, and the store keeps the failed
    call, so the fault is counted where the rollout is read.
    """
    problem = find_unreadable("generation", gen)
    if problem is not None:
        raise BackendError(f"the backend's answer cannot be recorded: {problem[1]}")
    return gen


def ok_call(
    call_id: str,
    attempt: Attempt,
    call: ParsedCall,
    gen: Generation,
    *,
    model: str,
    policy_version: int | None,
    started_at: float,
    ended_at: float,
) -> LLMCall:
    """The record of a served call: request, response, tokens, versions, usage, timing."""
    return LLMCall(
        id=call_id,
        rollout_id=attempt.rollout_id,
        attempt=attempt.number,
        request=call.record(),
        response={"message": assistant_message(gen), "finish_reason": gen.finish_reason},
        prompt_token_ids=gen.prompt_token_ids,
        response_token_ids=gen.response_token_ids,
        response_logprobs=gen.response_logprobs,
        policy_version=gen.policy_version if gen.policy_version is not None else policy_version,
        template_hash=gen.template_hash,
        model=model,
        usage=usage_of(gen),
        demonstration=gen.demonstration,
        started_at=started_at,
        ended_at=ended_at,
    )


def failed_call(
    call_id: str,
    attempt: Attempt,
    call: ParsedCall,
    error: BaseException,
    **fields: Any,
) -> LLMCall:
    """The record of a call the backend failed: request and error, no response, no tokens."""
    return LLMCall(
        id=call_id,
        rollout_id=attempt.rollout_id,
        attempt=attempt.number,
        request=call.record(),
        status="failed",
        error=f"{type(error).__name__}: {error}",
        **fields,
    )
