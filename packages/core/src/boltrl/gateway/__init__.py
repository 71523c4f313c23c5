"""The gateway: an OpenAI-compatible endpoint that records every rollout call exactly.

Agents get ``{gateway}/rollouts/{rollout_id}/attempts/{number}/{token}/v1`` as their
OpenAI ``base_url`` (``Attempt.route``: the attempt's lease token fences it); each call is
served by a ``Backend`` and filed as an ``LLMCall`` (prompt and response token ids,
logprobs, policy version, template hash) under that attempt before the agent sees the
answer, or refused (409) when the attempt is no longer the rollout's current one. ``/v1``
without a rollout serves calls that are not recorded. A gateway made with ``sessions=``
also records deployed agents' conversations (``/sessions/{id}/v1``) and takes their
feedback later (``gateway.sessions``).

Names are imported lazily: backends import ``boltrl.gateway.backend`` without paying
for the web stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Backend": "boltrl.gateway.backend",
    "Generation": "boltrl.gateway.backend",
    "GenerationRequest": "boltrl.gateway.backend",
    "Gateway": "boltrl.gateway.server",
    "SessionConfig": "boltrl.gateway.sessions",
    "create_gateway_app": "boltrl.gateway.app",
    "UpstreamBackend": "boltrl.gateway.upstream",
}

__all__ = [
    "Backend",
    "Gateway",
    "Generation",
    "GenerationRequest",
    "SessionConfig",
    "UpstreamBackend",
    "create_gateway_app",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'boltrl.gateway' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from boltrl.gateway.app import create_gateway_app
    from boltrl.gateway.backend import Backend, Generation, GenerationRequest
    from boltrl.gateway.server import Gateway
    from boltrl.gateway.sessions import SessionConfig
    from boltrl.gateway.upstream import UpstreamBackend
