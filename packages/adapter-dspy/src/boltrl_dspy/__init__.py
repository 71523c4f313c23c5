"""boltrl adapter for DSPy: one callback.

``BoltrlCallback`` records, inside a boltrl rollout, every LM call (the predictor path
that made it, its parent module call, request messages, response and its id, and
whether DSPy answered from its cache) and every tool call (ReAct tools included: name,
arguments, result or error, the LM call that chose it). Install it with
``dspy.configure(callbacks=[BoltrlCallback()])`` or ``instrument()``. Outside a rollout
it does nothing; it never raises into your program.
"""

from __future__ import annotations

from boltrl_dspy._hooks import BoltrlCallback, installed, instrument, stats, uninstrument

__all__ = ["BoltrlCallback", "installed", "instrument", "stats", "uninstrument"]
