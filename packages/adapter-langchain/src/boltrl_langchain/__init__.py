"""boltrl adapter for LangChain and LangGraph: one callback handler.

``BoltrlCallbackHandler`` records, inside a boltrl rollout, every chat-model call (agent
or LangGraph node, run tree, request messages in OpenAI form, response and its id) and
every tool run (name, arguments, result or error, the call that asked for it). Attach it
per run with ``config={"callbacks": [BoltrlCallbackHandler()]}``, or everywhere with
``instrument()``. Outside a rollout it does nothing; it never raises into your code.
"""

from __future__ import annotations

from boltrl_langchain._hooks import (
    BoltrlCallbackHandler,
    installed,
    instrument,
    stats,
    uninstrument,
)

__all__ = ["BoltrlCallbackHandler", "installed", "instrument", "stats", "uninstrument"]
