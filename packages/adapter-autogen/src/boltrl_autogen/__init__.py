"""boltrl adapter for AutoGen AgentChat: one event-log handler.

``BoltrlEventHandler`` records, inside a boltrl rollout, every model call AutoGen logs
(agent name, request messages in OpenAI form, response and, when not streamed, the
response id) and every tool run (name, arguments, result or error, the call that asked
for it). ``instrument()`` attaches it to AutoGen's event loggers and enables them;
``uninstrument()`` puts the loggers back as they were. Outside a rollout it does
nothing; it never raises into your code.
"""

from __future__ import annotations

from boltrl_autogen._hooks import (
    AGENTCHAT_LOGGER,
    CORE_LOGGER,
    BoltrlEventHandler,
    installed,
    instrument,
    stats,
    uninstrument,
)

__all__ = [
    "AGENTCHAT_LOGGER",
    "CORE_LOGGER",
    "BoltrlEventHandler",
    "installed",
    "instrument",
    "stats",
    "uninstrument",
]
