"""Process isolation for runners: agents run in worker processes, not the runner's.

Each runner slot owns one worker process (started with ``spawn``: the runner is
multi-threaded, and ``fork`` would copy its locks mid-use). The worker imports the agent
once by its ``module:function`` spec and then runs rollout after rollout, so an agent's
warm state (a loaded index, a client pool) survives between rollouts. When a worker
dies — an exception cannot do that, but ``os._exit``, a segfault, the OOM killer or a
kill can — only its rollout fails (``worker_died``), and the slot starts a fresh worker
for the next one. The runner kills a worker whose rollout timed out or was taken away,
so nothing an abandoned agent does keeps running.

The agent's records (rewards, annotations, tool steps) travel to the runner over the
worker's pipe and are written to the store there, under the attempt the runner holds:
``emit_reward`` waits for that write, as in process, so a reward keeps its place among
the gateway's calls. Model calls go from the worker straight to the gateway.

Wire: runner → worker ``("run", attempt, task_input, llm)`` | ``("stop",)``;
worker → runner ``("ready",)`` | ``("load_failed", text)`` | ``("records", [...])``
(answered ``("ack", None | error)``) | ``("done", Outcome)``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from boltrl.errors import BoltrlError
from boltrl.records import LLM, AnyRecord, Attempt

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import the agent before it counts as failed."""


class WorkerDied(Exception):
    """The worker process running the agent died before the agent returned."""


class AgentLoadError(BoltrlError):
    """The worker could not import the agent spec."""

    code = "agent_load_failed"


@dataclass
class Outcome:
    """What the agent did, as the worker reports it (all plain, picklable values)."""

    reward: float | None = None
    bad_return: str | None = None
    """Why the returned value is not a reward, when it is not."""
    error_text: str | None = None
    """The traceback, when the agent raised."""
    error: bytes | None = None
    """The pickled exception (None when it does not pickle)."""
    error_name: str | None = None
    default_retryable: bool = False
    """The default rule's verdict, for an exception that did not pickle."""


class RemoteAgentError(Exception):
    """Stands in for an agent exception that could not be pickled back."""


# -- the worker process ---------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """Exit when the runner is gone (kill -9 included): an orphan has nowhere to report."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)


def worker_main(
    conn: multiprocessing.connection.Connection, spec: str, parent: int, memory_mb: int | None
) -> None:
    """Entry point of a worker process: load the agent, then run what the runner sends."""
    from boltrl._agent_run import _AgentRun, _as_reward, _default_retryable
    from boltrl.context import RolloutContext
    from boltrl.loading import load_object

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    if memory_mb is not None:  # a blow-up becomes the agent's MemoryError, not the OOM killer's
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        agent = load_object(spec, what="agent")
    except BaseException as e:
        conn.send(("load_failed", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready",))
    lock = threading.Lock()

    def sink(attempt: Attempt, records: Sequence[AnyRecord]) -> None:
        with lock:  # one request/answer at a time, from any of the agent's threads
            conn.send(("records", list(records)))
            _, error = conn.recv()
        if error is not None:
            raise RuntimeError(error)

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, attempt, task_input, llm = msg
        run = _AgentRun(agent, task_input, llm, RolloutContext(attempt, sink))
        run.run_here()
        out = Outcome()
        if run.error is not None:
            out.error_text = run.error_text
            out.error_name = type(run.error).__name__
            out.default_retryable = _default_retryable(run.error)
            try:
                out.error = pickle.dumps(run.error)
            except Exception:
                out.error = None
        else:
            try:
                out.reward = _as_reward(run.result)
            except (TypeError, ValueError) as e:
                out.bad_return = str(e)
        with lock:
            conn.send(("done", out))


# -- the runner's side ----------------------------------------------------------------


class Worker:
    """One worker process and the runner's end of its pipe."""

    def __init__(self, spec: str, memory_mb: int | None = None) -> None:
        parent, child = _SPAWN.Pipe(duplex=True)
        self.conn = parent
        self.process = _SPAWN.Process(
            target=worker_main,
            args=(child, spec, os.getpid(), memory_mb),
            name="boltrl-agent-worker",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.rollouts = 0
        if not self.conn.poll(_START_TIMEOUT_S):
            self.kill()
            raise AgentLoadError(f"agent worker did not start within {_START_TIMEOUT_S:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            self.kill()
            raise AgentLoadError(f"agent worker exited while loading {spec!r}") from None
        if msg[0] != "ready":
            self.kill()
            raise AgentLoadError(f"agent worker could not load {spec!r}: {msg[1]}")

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def death(self) -> str:
        """How the process ended, in words (after it did)."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        self.process.join(timeout_s)
        self.kill()


class ProcessRun:
    """One rollout in a worker process, shaped like the runner's thread-based run:
    ``done`` is set when the agent returned, raised, or its worker died."""

    def __init__(
        self,
        worker: Worker,
        attempt: Attempt,
        task_input: dict[str, Any],
        llm: LLM,
        record: Callable[[Sequence[AnyRecord]], None],
    ) -> None:
        self.done = threading.Event()
        self.result: float | None = None
        self.bad_return: str | None = None
        self.error: BaseException | None = None
        self.error_text: str | None = None
        self.worker = worker
        self._job = ("run", attempt, task_input, llm)
        self._record = record
        self._cancelled = False
        self._pump = threading.Thread(
            target=self._main, name=f"boltrl-worker-pipe-{attempt.rollout_id[-8:]}", daemon=True
        )

    def start(self) -> None:
        self.worker.rollouts += 1
        self._pump.start()

    def cancel(self) -> None:
        """Kill the worker: an abandoned agent must not keep running (or recording)."""
        self._cancelled = True
        self.worker.kill()
        self._pump.join(5.0)

    def _main(self) -> None:
        conn, sentinel = self.worker.conn, self.worker.process.sentinel
        try:
            conn.send(self._job)
            while True:
                multiprocessing.connection.wait([conn, sentinel])
                if not conn.poll():  # the process ended with nothing left to read
                    raise EOFError
                msg = conn.recv()
                if msg[0] == "records":
                    conn.send(("ack", self._store(msg[1])))
                elif msg[0] == "done":
                    self._finish(msg[1])
                    return
        except (EOFError, OSError):
            if not self._cancelled:
                how = self.worker.death()
                self.error = WorkerDied(f"the agent's worker process died ({how})")
                self.error_text = str(self.error)
        finally:
            self.done.set()

    def _store(self, records: list[AnyRecord]) -> str | None:
        if self._cancelled:
            return "the attempt has ended"
        try:
            self._record(records)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None

    def _finish(self, out: Outcome) -> None:
        if out.error_text is None:
            self.result, self.bad_return = out.reward, out.bad_return
            return
        self.error_text = out.error_text
        error: BaseException | None = None
        if out.error is not None:
            try:
                error = pickle.loads(out.error)
            except Exception:
                error = None
        if error is None:
            error = RemoteAgentError(out.error_name or "exception")
            error.default_retryable = out.default_retryable  # type: ignore[attr-defined]
        self.error = error


def agent_spec(agent: Callable[..., Any] | str) -> str:
    """The ``module:function`` a worker process imports the agent by."""
    if isinstance(agent, str):
        return agent
    module = getattr(agent, "__module__", None)
    name = getattr(agent, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise ValueError(
            f"isolation='process' imports the agent in a worker process, but {agent!r} has "
            "no importable name: pass its 'module:function' (or 'file.py:function') spec"
        )
    return f"{module}:{name}"


class SlotWorkers:
    """A runner's worker processes: one per slot, started on first use, reused across
    that slot's rollouts, replaced after it dies or is killed. Thread-safe per slot
    (each slot is used by its own thread only)."""

    def __init__(
        self, agent: Callable[..., Any] | str, slots: int, memory_mb: int | None = None
    ) -> None:
        self.spec = agent_spec(agent)
        self.memory_mb = memory_mb
        """Address-space limit of each worker (RLIMIT_AS), None for none."""
        self._workers: list[Worker | None] = [None] * slots

    def run(
        self, slot: int, attempt: Attempt, task_input: dict[str, Any], llm: LLM, ctx: Any
    ) -> ProcessRun:
        """A (not yet started) run of the attempt in the slot's worker; ``ctx`` (the
        runner's ``RolloutContext`` of the attempt) writes what the worker records."""
        worker = self._workers[slot]
        if worker is None or not worker.alive:
            if worker is not None:
                worker.kill()
            self._workers[slot] = None
            worker = self._workers[slot] = Worker(self.spec, self.memory_mb)
        return ProcessRun(worker, attempt, task_input, llm, ctx.send)

    def prestart(self) -> None:
        """Start every slot's worker now (importing the agent); AgentLoadError if it
        cannot be imported. Call before the slots run."""
        for slot, worker in enumerate(self._workers):
            if worker is None or not worker.alive:
                self._workers[slot] = Worker(self.spec, self.memory_mb)

    def stop(self, slot: int) -> None:
        worker, self._workers[slot] = self._workers[slot], None
        if worker is not None:
            worker.stop()
