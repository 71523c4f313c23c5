"""The gateway's backend in front of verl's vLLM servers.

verl starts one OpenAI-compatible vLLM server per rollout replica (``GPUs / rollout_tp``
of them). ``ReplicaPool`` forwards the gateway's calls to them through
``UpstreamBackend``, so token ids and logprobs come from the engine (vLLM's
``return_token_ids``), never from re-tokenizing. A rollout's calls stick to the replica
that served its first call (its growing prompt stays in that replica's prefix cache);
new rollouts go to the replica with the fewest calls in flight.

It is a ``boltrl_trainer.seams.PolicyServer``. Around a weight update the trainer holds
the pool ``paused()`` (``seams.weight_swap``): new calls wait, calls in flight finish,
then verl puts the engines to sleep, trains, syncs the new weights into them and wakes
them, and the pool serves the new ``policy_version``. Plain HTTP only: nothing here
imports verl.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from boltrl.errors import BackendUnavailable, InvalidInput
from boltrl.gateway.backend import Generation, GenerationRequest
from boltrl.gateway.upstream import UpstreamBackend

log = logging.getLogger(__name__)

__all__ = ["ReplicaPool", "served_model"]

_STICKY_MAX = 100_000  # rollouts remembered for stickiness (oldest forgotten first)


def served_model(base_url: str, *, timeout_s: float = 30.0) -> str:
    """The model name an OpenAI-compatible server serves (first of ``/models``)."""
    url = base_url.rstrip("/") + "/models"
    try:
        resp = httpx.get(url, timeout=timeout_s)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise BackendUnavailable(f"rollout server {base_url} did not list its model: {e!r}") from e


class ReplicaPool:
    """A gateway ``Backend`` over several OpenAI-compatible servers of one policy.

    ``base_urls``: each replica's OpenAI base URL (``http://10.0.0.5:41234/v1``).
    ``upstream_model``: the name the servers serve (see ``served_model``); ``model_name``
    is what the gateway serves (``policy``, as the torch backend). Thread-safe.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        upstream_model: str,
        *,
        model_name: str = "policy",
        policy_version: int = 0,
        timeout_s: float = 600.0,
    ) -> None:
        if not base_urls:
            raise ValueError("base_urls: at least one rollout server is needed")
        self.replicas = [
            UpstreamBackend(url, upstream_model, policy_version=policy_version, timeout_s=timeout_s)
            for url in base_urls
        ]
        self._name = model_name
        self._version = policy_version
        self._lock = threading.Condition()
        self._in_flight = [0] * len(self.replicas)
        self._turn = -1
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._open = threading.Event()
        self._open.set()
        self._stats = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "failed": 0}

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def policy_version(self) -> int:
        return self._version

    def _pick(self, rollout_id: str | None) -> int:
        """Replica for a call (caller holds the lock)."""
        if rollout_id is not None and rollout_id in self._sticky:
            self._sticky.move_to_end(rollout_id)
            return self._sticky[rollout_id]
        n = len(self.replicas)
        self._turn = (self._turn + 1) % n  # ties rotate, so sequential rollouts spread
        index = min(((self._turn + k) % n for k in range(n)), key=lambda i: self._in_flight[i])
        if rollout_id is not None:
            self._sticky[rollout_id] = index
            if len(self._sticky) > _STICKY_MAX:
                self._sticky.popitem(last=False)
        return index

    async def generate(self, request: GenerationRequest) -> Generation:
        """Forward to the rollout's replica; waits while the pool is paused."""
        while True:
            if not self._open.is_set():
                await asyncio.to_thread(self._open.wait)
            with self._lock:
                if self._open.is_set():  # not paused in between
                    index = self._pick(request.rollout_id)
                    self._in_flight[index] += 1
                    break
        try:
            out = await self.replicas[index].generate(request)
        except BaseException:
            with self._lock:
                self._stats["failed"] += 1
            raise
        finally:
            with self._lock:
                self._in_flight[index] -= 1
                self._lock.notify_all()
        with self._lock:
            self._stats["requests"] += 1
            self._stats["prompt_tokens"] += len(out.prompt_token_ids or [])
            self._stats["completion_tokens"] += len(out.response_token_ids or [])
        return out.model_copy(update={"model": self._name})

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold new calls and wait for the ones in flight; resume on exit."""
        with self._lock:
            self._open.clear()
            self._lock.wait_for(lambda: not any(self._in_flight))
        try:
            yield
        finally:
            self._open.set()

    def set_policy_version(self, version: int) -> None:
        """The version calls are recorded with from now on."""
        with self._lock:
            self._version = int(version)
            for r in self.replicas:
                r.policy_version = self._version

    def load_weights(self, path: Path) -> None:
        """Refused: vLLM's weights are synced by verl's workers, so a checkpoint reaches
        these servers through ``VerlTrainingBackend.load`` (or ``boltrl eval`` serves it
        in-process)."""
        raise InvalidInput(
            f"checkpoint: {path} cannot be loaded into the vLLM servers directly; the verl "
            "training backend loads it (VerlTrainingBackend.load)"
        )

    def stats(self) -> dict[str, int]:
        """Counters since start: ``requests``, ``prompt_tokens``, ``completion_tokens``,
        ``failed``."""
        with self._lock:
            return dict(self._stats)

    async def aclose(self) -> None:
        for r in self.replicas:
            await r.aclose()

    def close(self) -> None:
        """Close the HTTP clients. Idempotent."""
        try:
            asyncio.run(self.aclose())
        except RuntimeError:  # called from inside an event loop
            log.debug("ReplicaPool.close inside a running loop; clients close with it")
