"""``boltrl serve`` configuration: a ``boltrl train`` config plus a ``serve:`` section.

The policy (``model``, ``lora``, ``dtype``, ``device``), the update (``optim``,
``algo``), the credit, ``temperature`` / ``top_p`` / ``max_tokens`` (forced on every
live call, so the recorded logprobs are the distribution the update assumes), the
agent and ``out_dir`` / ``store`` mean what they mean for ``boltrl train``. The
``serve:`` section holds what only online learning has::

    serve:
      port: 4750
      feedback_timeout_s: 600
      learn: {every_sessions: 16, every_minutes: 5, max_staleness: 2}
      gate: {tasks: boltrl_trainer.demo:val_tasks, tolerance: 0.02, limit: 32}

Algorithm. Live sessions form no groups (no two users send the same task, so GRPO's
and RLOO's per-task baselines do not exist), and a round's batch is small and of
uneven size, so a batch-mean baseline would call half of every batch bad even when the
whole policy got better. ``boltrl serve`` therefore trains REINFORCE with a *running*
baseline (an exponential mean of past rounds' session rewards: "better than this
policy usually does"), the PPO clip on top. Leaving ``algorithm`` out picks it;
``algorithm: reinforce`` with ``algo`` settings tunes it; grpo/rloo are refused.

Errors name the field (``serve.gate.tolerance: ...``) before anything starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from boltrl.errors import InvalidInput
from boltrl_trainer.algorithms import AlgorithmConfig, make_config
from boltrl_trainer.config import TrainConfig, load_config

__all__ = ["GateConfig", "LearnConfig", "ServeConfig", "ServeSection", "load_serve_config"]


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LearnConfig(_Cfg):
    """When the background learner trains, and on what."""

    every_sessions: int = Field(default=16, ge=1)
    """Train once this many sessions got their feedback since the last round (N)."""
    every_minutes: float = Field(default=5.0, gt=0)
    """... or once this many minutes passed since the last round, whichever comes
    first (T), provided at least ``min_sessions`` are waiting."""
    min_sessions: int = Field(default=1, ge=1)
    """A timed round needs at least this many rewarded sessions."""
    max_staleness: int = Field(default=2, ge=0)
    """Train only on calls sampled by a policy at most this many promotions behind the
    served one (0: only the served version's own samples); older are dropped, counted."""
    max_sessions: int = Field(default=256, ge=1)
    """At most this many sessions per round (the oldest first; the rest wait)."""
    poll_s: float = Field(default=1.0, gt=0)
    """How often the learner looks for new feedback (and sweeps expired sessions)."""


class GateConfig(_Cfg):
    """The held-out check a candidate policy must pass before it is served."""

    tasks: str
    """Held-out tasks (a .jsonl/.json file or ``module:function``), run through the
    agent greedily, like ``boltrl eval``."""
    agent: str | None = None
    """The agent to run them with (``module:function`` / ``file.py:function``); default
    the config's ``agent``."""
    tolerance: float = Field(default=0.0, ge=0)
    """Promote when candidate score >= served score - tolerance."""
    limit: int | None = Field(default=None, ge=1)
    """Use only the first N tasks (keeps the gate cheap)."""


class ServeSection(_Cfg):
    """The ``serve:`` section."""

    host: str = "127.0.0.1"
    """Address the gateway binds; anything but loopback needs ``token``."""
    port: int = Field(default=4750, ge=0, le=65535)
    """Port (0: any free one, printed)."""
    token: str | None = None
    """API key agents must send (default ``$BOLTRL_GATEWAY_TOKEN``)."""
    feedback_timeout_s: float = Field(default=600.0, gt=0)
    """A session with no feedback this long after its last call expires: never
    trained on, not scored 0."""
    learn: LearnConfig = Field(default_factory=LearnConfig)
    gate: GateConfig
    """Required: no candidate is served unchecked."""


class ServeConfig:
    """A validated ``boltrl serve`` config: the training part and the ``serve:`` part."""

    def __init__(self, train: TrainConfig, serve: ServeSection, algo: AlgorithmConfig) -> None:
        self.train = train
        self.serve = serve
        self.algo = algo

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir)


def _format(e: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for err in e.errors():
        loc = ".".join(["serve", *(str(x) for x in err["loc"])])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see boltrl_trainer.serve_config)"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def _algorithm(cfg: TrainConfig) -> AlgorithmConfig:
    if cfg.backend != "torch":
        raise InvalidInput(f"backend: boltrl serve runs the torch backend (got {cfg.backend!r})")
    if not cfg.temperature > 0:
        raise InvalidInput(
            "temperature: must be > 0 for boltrl serve (live calls are sampled at it and "
            "trained on; the gate always runs at 0)"
        )
    if "algorithm" in cfg.model_fields_set and cfg.algorithm != "reinforce":
        raise InvalidInput(
            f"algorithm: boltrl serve trains with reinforce (got {cfg.algorithm!r}): live "
            "sessions form no task groups for grpo/rloo; write algorithm: reinforce or leave "
            "it out"
        )
    return make_config("reinforce", {"baseline": "running", **cfg.algo})


def load_serve_config(
    path: str | Path | None,
    overrides: list[str] | None = None,
    *,
    data: dict[str, Any] | None = None,
) -> ServeConfig:
    """Read and validate a ``boltrl serve`` config (``--set serve.port=0`` works too).

    Paths in ``serve.gate`` follow ``boltrl_trainer.config``'s rule (relative to the
    file they were written in). Raises ``InvalidInput`` naming every bad field."""
    train = load_config(path, overrides, data=data, sections=("serve",))
    raw = train.sections.get("serve")
    if raw is None:
        raise InvalidInput(
            f"invalid config {train.source}:\n  serve: required (at least serve.gate.tasks: "
            "the held-out tasks a new policy must pass)"
        )
    if not isinstance(raw, dict):
        raise InvalidInput(f"invalid config {train.source}:\n  serve: must be a mapping")
    try:
        section = ServeSection.model_validate(raw)
    except ValidationError as e:
        raise InvalidInput(_format(e, train.source)) from None
    if section.token is None:
        section = section.model_copy(update={"token": os.environ.get("BOLTRL_GATEWAY_TOKEN")})
    from_cli = {o.partition("=")[0].strip() for o in overrides or []}
    if path is not None and data is None:
        base = Path(path).resolve().parent
        gate = section.gate
        update: dict[str, Any] = {}
        for key in ("tasks", "agent"):
            value = getattr(gate, key)
            cli = any(k in from_cli for k in ("serve", "serve.gate", f"serve.gate.{key}"))
            if value is not None and not cli:
                update[key] = _relative(value, base)
        section = section.model_copy(update={"gate": gate.model_copy(update=update)})
    return ServeConfig(train, section, _algorithm(train))


def _relative(value: str, base: Path) -> str:
    """``file.py:fn`` / ``x.jsonl`` / ``x.json`` against ``base``; ``module:fn`` as is."""
    head = value.split(":", 1)[0]
    if head.endswith((".py", ".jsonl", ".json")) and not Path(head).is_absolute():
        return str(base / value)
    return value
