"""The trainer's two seams, and the one sequence that crosses both.

- ``PolicyServer``: what the gateway serves while training runs (a gateway ``Backend``
  that can also pause for a weight swap). ``TransformersBackend`` (in-process model) and
  verl's ``ReplicaPool`` (vLLM servers) implement it.
- ``TrainingBackend``: turns a ``TrainBatch`` into new weights. ``TorchTrainingBackend``
  and ``VerlTrainingBackend`` implement it.
- ``BackendKind``: one entry of the registry in ``boltrl_trainer.backends``: checks a
  config and builds the pair.
- ``weight_swap``: how new weights reach a live server, written once.
- ``CandidateTrainer`` + ``promote_swap``: a training backend that trains its own copy
  of the weights while the server keeps generating from the served ones; the pause is
  only for copying them in (async training, online learning's candidate + gate).

Everything here is light (no torch): the registry, the loop and ``boltrl eval`` import it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from boltrl.errors import InvalidInput
from boltrl.gateway.backend import Backend
from boltrl.records import Transition
from boltrl_trainer.config import TrainConfig

__all__ = [
    "BackendKind",
    "CandidateTrainer",
    "PolicyServer",
    "TrainBatch",
    "TrainingBackend",
    "promote_swap",
    "weight_swap",
]


@dataclass
class TrainBatch:
    """One step's training data. ``advantages[i]`` belongs to ``transitions[i]``."""

    transitions: list[Transition]
    advantages: list[float]
    policy_version: int
    """The trainer's version when the batch was made; each transition carries the version
    that sampled it (equal in the synchronous loop, up to ``max_staleness`` older in the
    async one)."""
    temperature: float
    """Sampling temperature: recomputed logprobs use it, to compare like with like."""
    groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        demos = [t for t in self.transitions if t.demonstration is not None]
        if demos:  # no behaviour logprobs: a policy-gradient ratio of them means nothing
            raise InvalidInput(
                f"transitions: {len(demos)} are demonstrations (e.g. rollout "
                f"{demos[0].rollout_id}, from {demos[0].demonstration}); RL trains on policy "
                "samples only (demonstrations are for boltrl sft / warm_start)"
            )


@runtime_checkable
class PolicyServer(Backend, Protocol):
    """A gateway ``Backend`` serving the policy being trained.

    Promises, beyond ``Backend``'s (``generate`` may be awaited concurrently and never
    blocks the event loop; replies carry the ``policy_version`` that produced them):

    - ``paused()`` blocks until the calls in flight finish; while the block runs no
      generation starts (new calls wait, they do not fail) and the weights may change;
      on exit, even by an exception, generation resumes. Thread-safe.
    - ``set_policy_version`` is the version replies are recorded with from then on.
      Thread-safe, also inside ``paused()``; never raises for an int.
    - ``load_weights(path)`` serves the weights a training checkpoint holds (weights only,
      paused while they change). Blocks; raises ``InvalidInput`` naming the path when it
      holds no weights this server can load.
    - ``stats()`` is cheap, thread-safe and never raises: counters since start, at least
      ``requests``, ``prompt_tokens`` and ``completion_tokens``.
    - ``close()`` releases everything; idempotent; calls after it fail with
      ``BackendUnavailable``. May block until the running batch ends.
    """

    def paused(self) -> AbstractContextManager[None]: ...

    def set_policy_version(self, version: int) -> None: ...

    def load_weights(self, path: Path) -> None: ...

    def stats(self) -> Mapping[str, int]: ...

    def close(self) -> None: ...


@runtime_checkable
class TrainingBackend(Protocol):
    """Turns batches of transitions into new policy weights.

    Promises:

    - ``update`` blocks until the new weights are where the paired ``PolicyServer``
      serves them from (the very model object for torch; synced into vLLM for verl), so
      the caller runs it inside ``weight_swap``. It returns metrics as plain floats
      (``update/*``, ``time/update_s``) and raises rather than leave half-applied
      weights unreported. ``policy_version`` counts the updates applied: +1 per update
      that changed the weights, unchanged for an empty batch (``update/skipped``).
    - ``save(path)`` writes everything needed to resume (weights, optimizer state) into
      a fresh folder; ``load(path, policy_version=v)`` restores it and from then on
      reports version ``v``.
    - ``close()`` releases workers and devices; idempotent.
    - Not thread-safe: one caller (the training loop).
    """

    @property
    def policy_version(self) -> int: ...

    def update(self, batch: TrainBatch) -> dict[str, float]: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path, *, policy_version: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class CandidateTrainer(TrainingBackend, Protocol):
    """A ``TrainingBackend`` whose ``update`` trains a copy of the weights (a candidate)
    and leaves the served ones alone, so generation goes on during the update.

    Promises, beyond ``TrainingBackend``'s (whose ``update`` no longer needs a pause once
    the copy is in use):

    - ``use_separate_copy(resettable=...)`` starts training a copy of the served weights
      as they are now (call it once they are final for the start: after a resume, an
      ``init_from`` or a warm start); before it, updates change the served weights in
      place (run them in ``weight_swap``). ``resettable`` makes ``reset`` possible.
    - ``promote()`` copies the candidate into the served weights and returns its version;
      the caller holds the server's ``paused()`` (``promote_swap`` does it all).
    - ``served_version`` is the version of the weights being served.
    - ``reset()`` discards the candidate: weights, version and optimizer state return to
      those of the last promotion; the served weights are not touched. Raises
      ``RuntimeError`` when the backend was not made resettable.
    """

    @property
    def served_version(self) -> int: ...

    def use_separate_copy(self, *, resettable: bool = False) -> None: ...

    def promote(self) -> int: ...

    def reset(self) -> None: ...


class BackendKind(Protocol):
    """One entry of the backend registry (``torch``, ``verl``).

    Promises: ``check`` is cheap, starts nothing and raises ``InvalidInput`` listing
    every problem, each naming its field (settings that would do nothing under this
    backend, and a missing installation); ``build`` and ``serve`` may take minutes
    (model load, workers) and expect a config that passed ``check``.
    """

    name: str

    def check(self, cfg: TrainConfig) -> None: ...

    def build(self, cfg: TrainConfig) -> tuple[PolicyServer, TrainingBackend]:
        """The server the gateway serves and the backend that trains its weights."""
        ...

    def serve(self, cfg: TrainConfig, checkpoint: Path | None = None) -> PolicyServer:
        """A server of the configured policy for evaluation (no training state), with
        ``checkpoint``'s weights when given."""
        ...


@contextlib.contextmanager
def weight_swap(server: PolicyServer, trainer: TrainingBackend) -> Iterator[None]:
    """Change the weights under a live server: the one pause / version / resume sequence.

    Generation pauses (calls in flight finish, new ones wait); the block changes the
    weights through ``trainer`` (``update``, ``load``); then the server serves
    ``trainer.policy_version`` and generation resumes. When the block raises, the
    served version stays as it was and generation still resumes.
    """
    with server.paused():
        yield
        server.set_policy_version(trainer.policy_version)


def promote_swap(server: PolicyServer, trainer: CandidateTrainer) -> int:
    """Serve a candidate: pause (calls in flight finish on the old version and are
    labelled so), copy the trained weights in, serve their version, resume. Returns it."""
    with server.paused():
        version = trainer.promote()
        server.set_policy_version(version)
    return version
