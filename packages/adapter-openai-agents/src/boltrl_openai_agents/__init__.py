"""boltrl adapter for the OpenAI Agents SDK: one tracing processor.

``BoltrlTracingProcessor`` records, inside a boltrl rollout, every model call the SDK
makes (agent name, agent span, request messages in OpenAI form, response and, where the
SDK exposes it, the response id) and every function tool run and handoff (name,
arguments, result or error, the call that asked for it). Register it with
``agents.add_trace_processor(BoltrlTracingProcessor())`` or ``instrument()``; it works
with both ``OpenAIChatCompletionsModel`` and ``OpenAIResponsesModel``, streamed or not.
Outside a rollout it does nothing; it never raises into your code.
"""

from __future__ import annotations

from boltrl_openai_agents._hooks import (
    BoltrlTracingProcessor,
    installed,
    instrument,
    stats,
    uninstrument,
)

__all__ = ["BoltrlTracingProcessor", "installed", "instrument", "stats", "uninstrument"]
