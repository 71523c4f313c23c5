"""boltrl_trainer: the trainer's seams, the in-process policy server, RL algorithms and
the training loop.

Names are imported lazily, so ``import boltrl_trainer`` stays light (no torch until used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boltrl_trainer.models import DEFAULT_MODEL, load_model, resolve_model, tiny_model
    from boltrl_trainer.seams import PolicyServer, TrainBatch, TrainingBackend, weight_swap
    from boltrl_trainer.serving import TransformersBackend

_EXPORTS = {
    "DEFAULT_MODEL": "boltrl_trainer.models",
    "PolicyServer": "boltrl_trainer.seams",
    "TrainBatch": "boltrl_trainer.seams",
    "TrainingBackend": "boltrl_trainer.seams",
    "TransformersBackend": "boltrl_trainer.serving",
    "load_model": "boltrl_trainer.models",
    "resolve_model": "boltrl_trainer.models",
    "tiny_model": "boltrl_trainer.models",
    "weight_swap": "boltrl_trainer.seams",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'boltrl_trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
