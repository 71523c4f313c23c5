"""boltrl: train any AI agent with reinforcement learning without rewriting it.

The agent runs unchanged and talks to its model through boltrl's OpenAI-compatible
gateway; adapters add structure; records become MDP transitions; a trainer updates the
model. See the package README for the quick start.

Public names are imported lazily so ``import boltrl`` stays cheap (adapters import it
on every agent start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # records
    "Task": "boltrl.records",
    "Rollout": "boltrl.records",
    "RolloutStatus": "boltrl.records",
    "Attempt": "boltrl.records",
    "AttemptOutcome": "boltrl.records",
    "LLMCall": "boltrl.records",
    "CallAnnotation": "boltrl.records",
    "ToolStep": "boltrl.records",
    "RewardEvent": "boltrl.records",
    "Transition": "boltrl.records",
    "LLM": "boltrl.records",
    "Resources": "boltrl.records",
    "SCHEMA_VERSION": "boltrl.records",
    # rollout context
    "emit_reward": "boltrl.context",
    "record_tool_step": "boltrl.context",
    "annotate_call": "boltrl.context",
    "current_rollout": "boltrl.context",
    # store
    "Store": "boltrl.store",
    "open_store": "boltrl.store",
    # runner
    "Runner": "boltrl.runner",
    "run_rollout": "boltrl.local",
    # gateway
    "Backend": "boltrl.gateway.backend",
    "Gateway": "boltrl.gateway",
    "UpstreamBackend": "boltrl.gateway.upstream",
    # credit assignment
    "transitions": "boltrl.credit",
    "CreditConfig": "boltrl.credit",
}

__all__ = [*_EXPORTS, "__version__"]

_ALIASES = {"current_rollout": "current"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'boltrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from boltrl.context import annotate_call, emit_reward, record_tool_step
    from boltrl.context import current as current_rollout
    from boltrl.credit import CreditConfig, transitions
    from boltrl.gateway import Gateway
    from boltrl.gateway.backend import Backend
    from boltrl.gateway.upstream import UpstreamBackend
    from boltrl.local import run_rollout
    from boltrl.records import (
        LLM,
        SCHEMA_VERSION,
        Attempt,
        AttemptOutcome,
        CallAnnotation,
        LLMCall,
        Resources,
        RewardEvent,
        Rollout,
        RolloutStatus,
        Task,
        ToolStep,
        Transition,
    )
    from boltrl.runner import Runner
    from boltrl.store import Store, open_store
