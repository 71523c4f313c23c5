"""One agent invocation: its thread, its event loop, and what its return value means.

Shared by the runner's thread slots (``boltrl.runner``) and the worker processes of
``isolation="process"`` (``boltrl._workers``), so both judge an outcome alike.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import math
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from boltrl.context import RolloutContext
from boltrl.records import LLM

log = logging.getLogger(__name__)

AgentFn = Callable[[dict[str, Any], LLM], "float | Awaitable[float | None] | None"]


class Retryable(Exception):
    """Raise from an agent to fail the attempt and have the rollout retried."""


def _default_retryable(exc: BaseException) -> bool:
    """Transient infrastructure errors are retried; the agent's own bugs are not."""
    if isinstance(exc, Retryable | ConnectionError | TimeoutError):
        return True
    if getattr(exc, "default_retryable", False):  # judged in the worker process
        return True
    name = type(exc).__name__
    # openai / httpx connection-level failures, without importing either
    return name in {"APIConnectionError", "APITimeoutError", "ConnectError", "ReadTimeout"}


class _AgentRun:
    """One agent invocation in its own thread; the supervisor waits on ``done``."""

    def __init__(self, agent: AgentFn, task_input: dict[str, Any], llm: LLM, ctx: RolloutContext):
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.error_text: str | None = None
        self._agent = agent
        self._args = (task_input, llm)
        self._ctx = ctx
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"boltrl-agent-{ctx.rollout_id[-8:]}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def run_here(self) -> None:
        """Run the agent in the calling thread (a worker process's main thread)."""
        self._main()

    def _main(self) -> None:
        try:
            with self._ctx:
                out = self._agent(*self._args)
                if inspect.isawaitable(out):
                    out = self._run_async(out)
                self.result = out
        except BaseException as e:  # the agent's failure is data, not our crash
            self.error = e
            self.error_text = "".join(traceback.format_exception(e))
        finally:
            self.done.set()

    def _run_async(self, awaitable: Awaitable[Any]) -> Any:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def main() -> Any:
            self._task = asyncio.current_task()
            return await awaitable

        try:
            return loop.run_until_complete(main())
        finally:
            _close_loop(loop)

    def cancel(self) -> None:
        """Best effort: cancel an async agent; a sync one is left to finish on its own."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass


_EXECUTOR_SHUTDOWN_S = 5.0
"""How long a finished async rollout waits for its loop's default-executor jobs."""


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """End a rollout's event loop the way ``asyncio.run`` does: cancel the tasks the
    agent left behind (and let them run their ``finally`` blocks), finish async
    generators, shut down the default executor, then close. Without this, a framework's
    background task is destroyed pending and transports collected after ``close`` print
    "Event loop is closed". Unlike ``asyncio.run`` on 3.11, the executor wait is bounded,
    so a stuck ``run_in_executor`` job cannot hold the slot.

    One step more than ``asyncio.run``: a collection of garbage while the loop still
    runs. Clients an agent dropped unclosed (openai's ``AsyncOpenAI``) schedule their own
    close on *the running loop* when collected; collected later, in another loop (the
    next rollout's, the gateway's), that close fails with "Event loop is closed"."""
    try:
        _cancel_all(loop)
        loop.run_until_complete(_collect_garbage())
        _cancel_all(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        try:
            loop.run_until_complete(
                asyncio.wait_for(loop.shutdown_default_executor(), _EXECUTOR_SHUTDOWN_S)
            )
        except TimeoutError:
            log.warning(
                "boltrl runner: the agent's executor jobs outlived it by %.0f s; left running",
                _EXECUTOR_SHUTDOWN_S,
            )
    finally:
        loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    leftover = asyncio.all_tasks(loop)
    for task in leftover:
        task.cancel()
    if not leftover:
        return
    loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
    for task in leftover:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception in a task left by the agent",
                    "exception": task.exception(),
                    "task": task,
                }
            )


def freeze_long_lived() -> None:
    """Collect garbage once, then exempt every object alive now from later collections
    (``gc.freeze``). For a process that has loaded what it keeps (a model, the SDKs):
    each finished async rollout collects garbage (``_close_loop``), and a full collection
    scans every tracked object, ~0.4 s with torch, transformers and a model loaded (575k
    objects) while holding the GIL that generation needs; after this it scans only what
    was made since. Frozen objects that later become cyclic garbage are never freed, so
    call it after setup, not per rollout."""
    gc.collect()
    gc.freeze()


async def _collect_garbage() -> None:
    gc.collect()
    # Let the close tasks that collection scheduled run (bounded).
    closing = asyncio.all_tasks() - {asyncio.current_task()}
    if closing:
        await asyncio.wait(closing, timeout=_EXECUTOR_SHUTDOWN_S)


def _as_reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool | int | float):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"agent returned a non-finite reward ({value!r})")
        return f
    raise TypeError(f"agent returned {type(value).__name__}; expected a float reward or None")
