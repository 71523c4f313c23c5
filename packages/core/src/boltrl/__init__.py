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

__all__ = [
    "LLM",
    "SCHEMA_VERSION",
    "Attempt",
    "AttemptOutcome",
    "Backend",
    "CallAnnotation",
    "CreditConfig",
    "Gateway",
    "LLMCall",
    "Resources",
    "RewardEvent",
    "Rollout",
    "RolloutStatus",
    "Runner",
    "Store",
    "Task",
    "ToolStep",
    "Transition",
    "UpstreamBackend",
    "__version__",
    "annotate_call",
    "current_rollout",
    "emit_reward",
    "open_store",
    "record_tool_step",
    "run_rollout",
    "transitions",
]

_ALIASES = {"current_rollout": "current"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'boltrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from boltrl.context import (
        annotate_call as annotate_call,
    )
    from boltrl.context import current as current_rollout
    from boltrl.context import (
        emit_reward as emit_reward,
    )
    from boltrl.context import (
        record_tool_step as record_tool_step,
    )
    from boltrl.credit import CreditConfig as CreditConfig
    from boltrl.credit import transitions as transitions
    from boltrl.gateway import Gateway as Gateway
    from boltrl.gateway.backend import Backend as Backend
    from boltrl.gateway.upstream import UpstreamBackend as UpstreamBackend
    from boltrl.local import run_rollout as run_rollout
    from boltrl.records import (
        LLM as LLM,
    )
    from boltrl.records import (
        SCHEMA_VERSION as SCHEMA_VERSION,
    )
    from boltrl.records import (
        Attempt as Attempt,
    )
    from boltrl.records import (
        AttemptOutcome as AttemptOutcome,
    )
    from boltrl.records import (
        CallAnnotation as CallAnnotation,
    )
    from boltrl.records import (
        LLMCall as LLMCall,
    )
    from boltrl.records import (
        Resources as Resources,
    )
    from boltrl.records import (
        RewardEvent as RewardEvent,
    )
    from boltrl.records import (
        Rollout as Rollout,
    )
    from boltrl.records import (
        RolloutStatus as RolloutStatus,
    )
    from boltrl.records import (
        Task as Task,
    )
    from boltrl.records import (
        ToolStep as ToolStep,
    )
    from boltrl.records import (
        Transition as Transition,
    )
    from boltrl.runner import Runner as Runner
    from boltrl.store import Store as Store
    from boltrl.store import open_store as open_store
